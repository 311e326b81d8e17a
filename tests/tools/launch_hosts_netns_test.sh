#!/usr/bin/env bash
# troupe-launch --hosts on two "hosts": network namespaces joined by a veth pair (10.77.<n>.1 and
# .2), entered by an --rsh script, two workers each (mw_worker's collectives scenario). Also
# --log-dir and --ranks 0, and TROUPE_* variables reaching the remote workers. Exits 77 (skipped,
# with a message) where the machine does not allow network namespaces.
# Usage: launch_hosts_netns_test.sh TROUPE_LAUNCH MW_WORKER EXPECT_SH
set -u
launch="$1" worker="$2" expect="$3"
source "$(dirname "$0")/../common/two_hosts.sh" l 100

# The remote shell: `rsh HOST COMMAND` runs COMMAND in the namespace that owns HOST's address.
cat > "$dir/rsh" <<RSH
#!/bin/sh
case "\$1" in
  $net.1) ns=$a ;;
  $net.2) ns=$b ;;
  *) echo "rsh: no such host \$1" >&2; exit 255 ;;
esac
echo "\$1 \$2" >> "$dir/commands"
exec ip netns exec "\$ns" sh -c "\$2"
RSH
chmod +x "$dir/rsh"

TROUPE_CLUSTER_TOKEN="token-$tag" "$expect" 0 --match "^\[rank 0\] replicas 4 workers 4 task worker:0" \
  --match "^\[rank 0\] OK" --no-match "^\[rank [123]\]" -- \
  "$launch" --hosts "$net.1:2,$net.2:2" --rsh "$dir/rsh" --timeout 90 --log-dir "$dir/logs" --ranks 0 -- \
  "$worker" collectives || exit 1
for r in 1 2 3; do
  if ! grep -q "^replicas 4 workers 4 task worker:$r" "$dir/logs/rank-$r.log" || ! grep -q "^OK" "$dir/logs/rank-$r.log"; then
    echo "FAILED: rank $r's log does not say it passed:"
    cat "$dir/logs/rank-$r.log"
    exit 1
  fi
done
# The launcher's TROUPE_* variables went with each remote command.
if [ "$(grep -c "TROUPE_CLUSTER_TOKEN=token-$tag" "$dir/commands")" != 4 ]; then
  echo "FAILED: the remote commands do not all carry TROUPE_CLUSTER_TOKEN:"
  cat "$dir/commands"
  exit 1
fi
# A host the remote shell cannot reach: its worker fails (255, as ssh exits) and the others stop.
"$expect" 255 --match "troupe-launch: worker 1 \(pid [0-9]+, 10\.255\.0\.9:23456\) exited with status 255; stopping the others" \
  --match "rsh: no such host 10\.255\.0\.9" -- \
  "$launch" --hosts "$net.1,10.255.0.9" --rsh "$dir/rsh" --timeout 60 --grace 2 -- "$worker" collectives || exit 1
echo "PASSED four workers on two network namespaces ($net.1, $net.2) through --rsh"
