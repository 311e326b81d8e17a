#!/usr/bin/env bash
# Model::fit under ParameterServerStrategy against the same training in one process: ps_trainer
# (fit, the default) under troupe-launch with 1 ps task, 2 workers and a chief, and ps_trainer
# --mode local (the same model, data, optimizer and number of steps, synchronous, in one process),
# for SGD, momentum and Adam. Each run completes every closure, each loss falls below half its
# first value, and the cluster's loss curve stays close to the one-process curve: loss_last (the
# mean of the last 10 closures) within 15 % of the one-process run's first loss, and loss_first
# (the first 10) within 25 %.
#
# Why 15 %: updates are asynchronous. Each closure reads the variables as the ps tasks hold them
# when it starts, up to 3 closures staler than a synchronous step (fit keeps 2 per worker in
# flight), and both workers read the same shuffled stream, so the cluster does not take the
# one-process run's steps; the mean of 10 batch losses also moves by about 0.03 between runs.
# Measured on 2 cores: the last means differ by 0.03 (SGD), 0.02 (momentum) and 0.00-0.05 (Adam),
# 2-6 % of the first loss. The first 10 closures move more: the first 4 (2 per worker in flight)
# all start from the initial weights, and when they land together Adam's first steps (each about
# the learning rate per element) overshoot; measured over 14 runs the cluster's loss_first was
# 0.80-0.81 in 11 and 0.97-1.01 in 3, against 0.85 in one process (14-19 % of it). A run whose
# updates went missing, twice or at another rate lands far outside both bounds.
# Usage: ps_fit_check.sh TROUPE_LAUNCH PS_TRAINER
set -u
launch="$1"
trainer="$2"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
for optimizer in sgd momentum adam; do
  if ! local_line=$(timeout 60 "$trainer" --mode local --quiet --closures 80 --optimizer "$optimizer" 2>&1); then
    echo "FAILED ($optimizer): the one-process run failed: $local_line"; exit 1
  fi
  if ! timeout 80 "$launch" --timeout 60 --ps 1 -n 2 --chief -- "$trainer" --quiet --closures 80 \
      --optimizer "$optimizer" > "$out" 2>&1; then
    echo "FAILED ($optimizer): the cluster exited non-zero"; cat "$out"; exit 1
  fi
  line=$(grep "^\[rank 0\] result: closures=80 done=80 " "$out")
  [ -n "$line" ] || { echo "FAILED ($optimizer): no result line with 80 closures done"; cat "$out"; exit 1; }
  lf=$(field "$local_line" loss_first); ll=$(field "$local_line" loss_last)
  pf=$(field "$line" loss_first); pl=$(field "$line" loss_last)
  echo "$optimizer: one process loss_first=$lf loss_last=$ll; cluster loss_first=$pf loss_last=$pl"
  if ! awk -v lf="$lf" -v ll="$ll" -v pf="$pf" -v pl="$pl" 'function abs(x) { return x < 0 ? -x : x }
      BEGIN { exit !(lf > 0 && pf > 0 && ll < lf / 2 && pl < pf / 2 && abs(pf - lf) <= 0.25 * lf &&
                     abs(pl - ll) <= 0.15 * lf) }'; then
    echo "FAILED ($optimizer): the losses did not both fall to half, or the cluster's first is more than 25 %" \
         "or its last more than 15 % of $lf away"
    exit 1
  fi
done
echo PASSED
