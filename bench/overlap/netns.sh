# shellcheck shell=bash
# Network namespaces for bench/run_overlap.sh and run_aggregator_links.sh
# (sourced; needs root and iproute2; their names start with OV_PREFIX,
# co2ov unless set before sourcing). One namespace per worker and one for
# the aggregator shards, each joined by a veth pair to a bridge in a
# "switch" namespace:
#
#   co2ov-w<i> eth0 (10.99.0.<i+1>) ── p<i> ┐
#                                            br0 (co2ov-sw)
#   co2ov-agg  eth0 (10.99.0.100)   ── pa  ┘
#
# Each worker link is shaped with tc tbf in both directions (egress of the
# worker's eth0: its uplink; egress of the switch port p<i>: its downlink).
# The aggregator's link is not shaped: the shards stand for a service
# provisioned for all workers at once, so the bottleneck is each worker's
# own link. ov_link adds a round-trip delay and loss between every pair of
# hosts (bench/linkem/linkem.sh: a netfilter queue on each host's ingress,
# since this kernel has no netem), sets the hosts' TCP settings and checks
# the result with ping and iperf3.

OV_PREFIX=${OV_PREFIX:-co2ov}

# ov_own_session "$@": first thing in a benchmark script. Re-runs the
# script in its own process session (setsid), waits for it and exits with
# its status; in that session it sets the scheduler autogroup's nice to
# NICE (-10). With autogroups, per-process nice does not count against
# other process sessions, and on a shared machine other users' builds
# would otherwise take most of the CPU the workers' step time is measured
# on.
ov_own_session() {
  if [ -z "${CO2_OV_SESSION:-}" ]; then
    # Not a process group leader here, so setsid execs in place: $! is the
    # script itself, which a terminal's Ctrl-C does not reach directly.
    CO2_OV_SESSION=1 setsid "$0" "$@" &
    local child=$! rc=0
    trap 'kill -TERM "$child" 2>/dev/null || true' INT TERM
    wait "$child" || rc=$?
    if kill -0 "$child" 2>/dev/null; then wait "$child" || rc=$?; fi
    exit "$rc"
  fi
  echo "${NICE:--10}" >/proc/self/autogroup 2>/dev/null || true
}

# ov_start_shards DIR SHARDS LIMIT AGGREGATOR [flags...]: SHARDS fresh
# co2-aggregator shards in the aggregator namespace, on ports 50051 + i,
# each bounded by LIMIT seconds, logging to DIR/shard-<i>.log; their pids
# go to OV_SHARD_PIDS. ov_agg_list SHARDS: their addresses, comma-separated.
ov_start_shards() {
  local dir=$1 shards=$2 limit=$3 aggregator=$4 s
  shift 4
  OV_SHARD_PIDS=()
  for ((s = 0; s < shards; s++)); do
    ip netns exec "$OV_PREFIX-agg" timeout "$limit" "$aggregator" \
      --insecure --port=$((50051 + s)) --shard_index="$s" \
      --num_shards="$shards" --metrics_port=-1 "$@" >"$dir/shard-$s.log" 2>&1 &
    OV_SHARD_PIDS+=($!)
  done
  sleep 0.5
}

ov_agg_list() {
  local s list=""
  for ((s = 0; s < $1; s++)); do list+="${list:+,}$OV_AGG_ADDR:$((50051 + s))"; done
  echo "$list"
}

# ov_stop_shards: stops the shards ov_start_shards started.
ov_stop_shards() {
  local s
  for s in "${OV_SHARD_PIDS[@]}"; do
    kill "$s" 2>/dev/null || true
    wait "$s" 2>/dev/null || true
  done
}
OV_AGG_ADDR=10.99.0.100

ov_worker_addr() { echo "10.99.0.$(($1 + 1))"; }

# ov_session_up NAME WORKERS: a scratch directory /tmp/NAME-XXXXXX in
# OV_SCRATCH, and the namespaces with WORKERS unshaped worker links (ov_up,
# after taking down any left over); at exit the namespaces go down and the
# directory is removed (KEEP=1 keeps it); Ctrl-C and TERM exit 130.
ov_session_up() {
  OV_SCRATCH=$(mktemp -d "/tmp/$1-XXXXXX")
  trap ov_session_down EXIT
  trap 'exit 130' INT TERM
  ov_down
  ov_up "$2"
}

ov_session_down() {
  ov_down
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $OV_SCRATCH" >&2; else rm -rf "$OV_SCRATCH"; fi
}

# ov_train DIR WORKERS SHARDS LIMIT TRAIN AGGREGATOR [co2-train flags...]:
# one job with fresh shards (ov_start_shards) and WORKERS co2-train workers,
# each in its own namespace and bounded by LIMIT seconds, logging to
# DIR/w<i>.log; returns 1, the failed workers' last log lines on stderr,
# when any worker failed.
ov_train() {
  local dir=$1 workers=$2 shards=$3 limit=$4 train=$5 aggregator=$6
  local i failed=0 pids=()
  shift 6
  ov_start_shards "$dir" "$shards" "$limit" "$aggregator"
  for ((i = 0; i < workers; i++)); do
    ip netns exec "$OV_PREFIX-w$i" timeout "$limit" "$train" "$@" \
      --role=worker --worker="$i" --aggregators="$(ov_agg_list "$shards")" \
      --group_address="$(ov_worker_addr "$i")" >"$dir/w$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { failed=1; tail -5 "$dir/w$i.log" >&2; }
  done
  ov_stop_shards
  return "$failed"
}

# ov_up WORKERS: creates the namespaces, bridge and links (unshaped).
ov_up() {
  local workers=$1 i ns
  ip netns add "$OV_PREFIX-sw"
  ip -n "$OV_PREFIX-sw" link add br0 type bridge
  ip -n "$OV_PREFIX-sw" link set br0 up
  ip -n "$OV_PREFIX-sw" link set lo up
  for ((i = 0; i < workers; i++)); do
    ns=$OV_PREFIX-w$i
    ip netns add "$ns"
    ip link add p$i netns "$OV_PREFIX-sw" type veth peer name eth0 netns "$ns"
    ip -n "$ns" addr add "$(ov_worker_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$OV_PREFIX-sw" link set p$i master br0 up
  done
  ns=$OV_PREFIX-agg
  ip netns add "$ns"
  ip link add pa netns "$OV_PREFIX-sw" type veth peer name eth0 netns "$ns"
  ip -n "$ns" addr add "$OV_AGG_ADDR/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$OV_PREFIX-sw" link set pa master br0 up
}

# ov_shape WORKERS RATE (tc syntax, e.g. 1gbit): tbf on both directions of
# every worker link. The bucket holds 4 ms at the rate (and at least 128 KiB:
# veth hands tbf 64 KiB GSO segments), so shaping stays smooth at HZ=250.
ov_shape() {
  local workers=$1 rate=$2 i bits burst
  bits=$(tc_rate_bits "$rate")
  burst=$((bits / 8 / 250))
  if ((burst < 131072)); then burst=131072; fi
  for ((i = 0; i < workers; i++)); do
    ip netns exec "$OV_PREFIX-w$i" tc qdisc replace dev eth0 root tbf \
      rate "$rate" burst "$burst" latency 50ms
    ip netns exec "$OV_PREFIX-sw" tc qdisc replace dev p$i root tbf \
      rate "$rate" burst "$burst" latency 50ms
  done
}

tc_rate_bits() {
  case $1 in
    *gbit) echo $((${1%gbit} * 1000000000)) ;;
    *mbit) echo $((${1%mbit} * 1000000)) ;;
    *) echo "unsupported rate $1 (use Nmbit or Ngbit)" >&2; return 1 ;;
  esac
}

# ov_down: deletes every namespace this file creates (veths go with them).
ov_down() {
  local ns
  ov_undelay
  for ns in $(ip netns list | awk '{print $1}' | grep "^$OV_PREFIX-"); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns delete "$ns" || true
  done
}

# ov_link WORKERS RATE RTT_MS LOSS HOSTS OUT: the whole link of a benchmark
# run: tbf at RATE on every worker link (ov_shape), RTT_MS between any two
# hosts and LOSS per direction (ov_delay), the hosts' TCP settings HOSTS
# (ov_host_tcp: default or tuned), then the self-check (ov_check_link),
# whose measured figures go to the JSON file OUT. Returns 1 if the check
# fails. RTT_MS 0 and LOSS 0 add no queue.
ov_link() {
  local workers=$1 rate=$2 rtt=$3 loss=$4 hosts=$5 out=$6
  ov_shape "$workers" "$rate"
  ov_delay "$workers" "$rtt" "$loss"
  ov_host_tcp "$workers" "$hosts"
  ov_check_link "$rate" "$rtt" "$loss" "$hosts" "$out"
}

source "$(dirname "${BASH_SOURCE[0]}")/../linkem/linkem.sh"
