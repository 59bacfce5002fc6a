#!/bin/bash
# Long, lossy links (docs/performance.md §2, "Long links"): the share of a
# link a round's exchange reaches, over emulated paths with a rate, a round
# trip and a loss rate (bench/overlap/netns.sh's ov_link: tc tbf, then
# co2-linkem holding every packet for RTT/2 on each host's ingress). Per
# cell and shard count S, in one invocation on the same link:
#   - aggregator_bench: N workers, each in its own namespace, rounds of P
#     fp32 parameters through S shards, --idle_s between rounds (a round's
#     compute: long enough for TCP to restart slow start where the host lets
#     it), the shards' windows growing with the path (the default); its
#     first round is the cold one, the median of the others the warm one;
#     iperf3 moving the same bytes and a Gloo ring all-reduce of the same
#     floats over the same links;
#   - two rounds of PARAMS_REF (4M) parameters with every stream window
#     fixed at 1 MiB (--stream_window_bytes=1048576, the shard's window
#     before windows grew with the path), the reference: window-limited,
#     its warm share does not depend on P, and 32M would take minutes.
# P is chosen per rate so that a worker's fp32 delta takes about a second
# on its link (4M parameters at 100 Mbit/s, 32M at 1 Gbit/s): a round then
# lasts about a second of transfer plus what the path adds.
# The hosts' TCP settings are HOSTS (tuned: docs/operations.md's, or
# default: Linux's). Writes bench/results/long_links.json (every cell with
# the link's self-check: what ping and iperf3 measured) and
# bench/results/long_links.png. Needs root, iproute2, iptables, iperf3,
# gnuplot and a build with co2-linkem.
#   sudo bench/run_long_links.sh [BUILD_DIR]              (~75 min)
# Environment: RATES ("100mbit 1gbit"), RTTS ("0 20 50 100 200", ms),
# LOSSES ("0 0.001"), SHARDS ("1 2"), WORKERS (4), PARAMS_<rate> (P at that
# rate), PARAMS_REF (4194304), ROUNDS (4), REPS (1: repetitions of each
# run; medians), IDLE_S (1), HOSTS (tuned), REFERENCE (1: run the
# fixed-window reference), OUT, KEEP=1 keeps the scratch directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OV_PREFIX=co2ll
source "$here/overlap/netns.sh"
ov_own_session "$@"
build=$(cd "${1:-build}" && pwd)
OV_LINKEM=$build/bin/co2-linkem
out=${OUT:-$here/results/long_links.json}
plot=${PLOT:-${out%.json}.png}
workers=${WORKERS:-4}
hosts_profile=${HOSTS:-tuned}

ov_session_up co2-long-links "$workers"
OV_LINKEM_DIR=$OV_SCRATCH
hosts=""
for ((i = 0; i < workers; i++)); do hosts+="${hosts:+,}$(ov_worker_addr "$i")"; done

PARAMS_100mbit=${PARAMS_100mbit:-4194304}
PARAMS_1gbit=${PARAMS_1gbit:-33554432}

# bench RUN_DIR RATE SHARDS [aggregator_bench flags...]: one
# aggregator_bench run (later flags override earlier ones).
bench() {
  local dir=$1 params_var=PARAMS_$2 shards=$3
  shift 3
  "$build/bench/aggregator_bench" --aggregator="$build/bin/co2-aggregator" \
    --netns="$OV_PREFIX" --shard_host="$OV_AGG_ADDR" --worker_hosts="$hosts" \
    --workers="$workers" --params="${!params_var:?no PARAMS_$2 for rate $2}" \
    --shards="$shards" --rounds="${ROUNDS:-4}" --repetitions="${REPS:-1}" \
    --idle_s="${IDLE_S:-1}" --scratch="$dir" --out="$dir.json" "$@" \
    2>"$dir.log" || { tail -5 "$dir.log" >&2; return 1; }
}

cells=()
for rate in ${RATES:-100mbit 1gbit}; do
  for rtt in ${RTTS:-0 20 50 100 200}; do
    for loss in ${LOSSES:-0 0.001}; do
      cell=$OV_SCRATCH/$rate-$rtt-$loss
      mkdir -p "$cell"
      ov_undelay
      ov_link "$workers" "$rate" "$rtt" "$loss" "$hosts_profile" "$cell/link.json" \
        || echo "long_links: $rate $rtt ms $loss: the link's self-check failed; recorded" >&2
      for shards in ${SHARDS:-1 2}; do
        echo "long_links: $rate, RTT $rtt ms, loss $loss, S=$shards" >&2
        bench "$cell/s$shards" "$rate" "$shards"
        if [ "${REFERENCE:-1}" = 1 ]; then
          bench "$cell/s$shards-fixed" "$rate" "$shards" --rounds=2 \
            --params="${PARAMS_REF:-4194304}" \
            --iperf3= --gloo=false --shard_flags=--stream_window_bytes=1048576
        fi
      done
      ov_undelay
      mv "$OV_SCRATCH"/linkem-*.json "$cell/" 2>/dev/null || true
      cells+=("$cell")
    done
  done
done

python3 "$here/long_links_report.py" --out="$out" --plot="$plot" \
  --command="bench/run_long_links.sh${1:+ $1}" --hosts="$hosts_profile" "${cells[@]}"
