#!/usr/bin/env bash
# How long a ps task SIGKILLed mid-fit takes to be back in training when troupe-launch restarts it
# alone (--max-restarts): ps_trainer (fit, Adam, a checkpoint every 20 steps) on --ps 1 -n 2
# --chief; the ps task is killed after the second checkpoint. Every line of the launcher is
# stamped as it arrives; printed: from the kill to the launcher's restart line, to the chief
# reaching the new ps task, to fit's resume line, and to the first progress line after it (10
# closures done after the resume). The launcher's --restart-backoff (default here 0.2 s) is part
# of it. Usage: bench/ps_restart_time.sh BUILD_DIR [RUNS] [BACKOFF_S]
set -u
build="$1"
runs="${2:-3}"
backoff="${3:-0.2}"
launch="$build/tools/troupe-launch"
trainer="$build/examples/ps_trainer"
for run in $(seq 1 "$runs"); do
  dir="$(mktemp -d)"
  stamp() { while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N)" "$l"; done; }
  ( "$launch" --timeout 150 --max-restarts 1 --restart-backoff "$backoff" --ps 1 -n 2 --chief -- "$trainer" \
      --closures 400 --step-delay-ms 20 --checkpoint-dir "$dir/ckpt" --checkpoint-every 20 2>&1 | stamp > "$dir/out" ) &
  group=$!
  for _ in $(seq 1 600); do
    [ "$(ls -d "$dir"/ckpt/ckpt-* 2>/dev/null | grep -cv '\.tmp-')" -ge 2 ] && break
    sleep 0.1
  done
  ps_pid=""
  for p in $(pgrep -f -- "--checkpoint-dir $dir/ckpt"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -q '^TF_CONFIG=.*"type": *"ps"' && ps_pid=$p
  done
  [ -n "$ps_pid" ] || { echo "run $run: no ps task found"; cat "$dir/out"; exit 1; }
  killed=$(date +%s.%N)
  kill -KILL "$ps_pid"
  wait "$group"
  t() { awk -v k="$killed" -v pat="$1" '$0 ~ pat { printf "%.2f", $1 - k; exit }' "$dir/out"; }
  after_resume=$(awk -v k="$killed" '/training resumes at step/ { r = 1; next } r && /closures [0-9]+\/400 done/ { printf "%.2f", $1 - k; exit }' "$dir/out")
  echo "run $run: restart line $(t 'restarting it alone') s, reached again $(t 'reached /job:ps/replica:0/task:0 again') s," \
       "resume line $(t 'training resumes at step') s, first progress after it $after_resume s;" \
       "$(grep -o 'training resumes at step [0-9]* (it had reached step [0-9]*)' "$dir/out")"
  grep -o 'result: .*' "$dir/out"
  rm -rf "$dir"
done
