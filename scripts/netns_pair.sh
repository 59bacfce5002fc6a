# shellcheck shell=bash
# netns_pair NETNS VETH SUBNET: a network namespace NETNS joined to this one
# by a veth pair, VETHa here (SUBNET.1/30) and VETHb in NETNS (SUBNET.2/30),
# both up, with NETNS's loopback up. Returns 1, having made nothing, if the
# namespace cannot be added (needs root / CAP_SYS_ADMIN). Sourced by
# tests/fault_training_test.sh and bench/chaos/run.sh.
netns_pair() {
  local netns=$1 veth=$2 subnet=$3
  ip netns add "$netns" 2>/dev/null || return 1
  ip link add "${veth}a" type veth peer name "${veth}b"
  ip link set "${veth}b" netns "$netns"
  ip addr add "$subnet.1/30" dev "${veth}a"
  ip link set "${veth}a" up
  ip netns exec "$netns" ip addr add "$subnet.2/30" dev "${veth}b"
  ip netns exec "$netns" ip link set "${veth}b" up
  ip netns exec "$netns" ip link set lo up
}
