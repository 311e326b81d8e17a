# Sourced by the multi-host tests: two "hosts" of their own, network namespaces $a and $b joined
# by a veth pair, with the addresses $net.1 and $net.2, and a scratch folder $dir. Everything is
# removed on exit (the namespaces' processes killed first). Exits 77 (skipped, with a message)
# where the machine does not allow network namespaces.
# Usage: source two_hosts.sh TAG SUBNET_OFFSET   (distinct tags and offsets for tests that may run together)
tag="$1$$"
a="troupe-${1}a-$tag"
b="troupe-${1}b-$tag"
net="10.77.$(( ($$ + $2) % 200 + 1 ))"
dir="$(mktemp -d)"
cleanup() {
  ip netns pids "$a" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$b" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
if ! command -v ip >/dev/null || ! ip netns add "$a" 2>/dev/null; then
  echo "SKIPPED: network namespaces are not available here (needs root and iproute2)"
  exit 77
fi
ip netns add "$b" || { echo "SKIPPED: cannot create a second network namespace"; exit 77; }
ip link add "va-$tag" type veth peer name "vb-$tag" || { echo "SKIPPED: cannot create a veth pair"; exit 77; }
ip link set "va-$tag" netns "$a"
ip link set "vb-$tag" netns "$b"
ip -n "$a" addr add "$net.1/24" dev "va-$tag"
ip -n "$b" addr add "$net.2/24" dev "vb-$tag"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "va-$tag" up
ip -n "$b" link set "vb-$tag" up
