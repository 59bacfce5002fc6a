#!/bin/bash
# Aggregator throughput over links (docs/performance.md §2):
# the benchmark of run_aggregator.sh, but with every worker (and Gloo rank)
# in its own network namespace behind a tc-tbf-shaped link (both
# directions) and the S shards in another, unshaped, as in
# bench/overlap/netns.sh: hosts on their own links, where the links and not
# loopback's CPU are the limit. Per repetition, in one invocation: the
# aggregator streaming updates (the default), the same with
# --stream_updates=false (each update sent once its whole round closed),
# iperf3 moving each worker's bytes over its own link (all uplinks at once,
# then all downlinks; the limit counts the two directions as running in
# parallel), and a Gloo ring all-reduce of the same P floats over the same
# links. Then streaming and whole rounds again with a checkpoint of every
# round (with_checkpoints in the JSON). Writes
# bench/results/aggregator_links.json. Needs root, iproute2 and iperf3.
#   sudo bench/run_aggregator_links.sh [BUILD_DIR]   (default build; ~10 min)
#   RATE=100mbit WORKERS=2,4,8 PARAMS=4194304 SHARDS=2 ROUNDS=4 REPS=3 OUT=...
#   RTT_MS=0 LOSS=0 HOSTS=default (bench/overlap/netns.sh's ov_link)
#   CHECKPOINT_DIR=... (default: under the scratch directory in /tmp)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
out=${OUT:-$here/results/aggregator_links.json}
rate=${RATE:-100mbit}
workers=${WORKERS:-2,4,8}
most=$(tr ',' '\n' <<<"$workers" | sort -n | tail -1)

OV_PREFIX=co2agg
source "$here/overlap/netns.sh"
scratch=$(mktemp -d /tmp/co2-aggregator-links-XXXXXX)
cleanup() {
  ov_down
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ov_down
ov_up "$most"
ov_link "$most" "$rate" "${RTT_MS:-0}" "${LOSS:-0}" "${HOSTS:-default}" \
  "$scratch/link.json"
hosts=""
for ((i = 0; i < most; i++)); do hosts+="${hosts:+,}$(ov_worker_addr "$i")"; done

"$build/bench/aggregator_bench" --aggregator="$build/bin/co2-aggregator" \
  --netns="$OV_PREFIX" --shard_host="$OV_AGG_ADDR" --worker_hosts="$hosts" \
  --workers="$workers" --params="${PARAMS:-4194304}" \
  --shards="${SHARDS:-2}" --rounds="${ROUNDS:-4}" \
  --repetitions="${REPS:-3}" --whole_round_reference \
  --scratch="$scratch/run" --out="$scratch/links.json"

# The same rounds with a checkpoint of every round on disk, as deployed
# (deploy/k8s): a chunk streamed ahead of its round's checkpoint is synced
# to the round journal first, and the whole-round reference waits for each
# round's checkpoint before sending anything of it.
"$build/bench/aggregator_bench" --aggregator="$build/bin/co2-aggregator" \
  --netns="$OV_PREFIX" --shard_host="$OV_AGG_ADDR" --worker_hosts="$hosts" \
  --workers="$workers" --params="${PARAMS:-4194304}" \
  --shards="${SHARDS:-2}" --rounds="${ROUNDS:-4}" \
  --repetitions="${REPS:-3}" --whole_round_reference --iperf3= --gloo=false \
  --checkpoint_dir="${CHECKPOINT_DIR:-$scratch/checkpoints}" \
  --scratch="$scratch/run-checkpoints" --out="$scratch/links-checkpoints.json"

python3 - "$scratch/links.json" "$scratch/links-checkpoints.json" "$out" "$rate" "bench/run_aggregator_links.sh${1:+ $1}" "$scratch/link.json" <<'PY'
import json, sys
path, checkpointed, out, rate, command, link_check = sys.argv[1:7]
report = json.load(open(path))
report["with_checkpoints"] = json.load(open(checkpointed))
report["link"] = {"rate": rate, "shaping": "tc tbf on both directions of every worker link; the shards' link unshaped; RTT_MS and LOSS (bench/linkem/linkem.sh) between any two hosts",
                  "check": json.load(open(link_check))}
report["command"] = command
json.dump(report, open(out, "w"), indent=1)
print(f"wrote {out}", file=sys.stderr)
PY
