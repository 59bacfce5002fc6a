#!/bin/bash
# Overlap under emulated slow links (docs/performance.md §1).
# 4 workers, each in its own network namespace behind a tc-tbf-shaped link,
# and the aggregator shards in another, train the 5.8M-parameter wide MLP
# (co2-train --model=wide) with: no communication (the upper bound), ddp
# (Gloo all-reduce every step through the same links), slowmo (blocking
# every τ) and co2, at each link rate. Writes bench/results/overlap.json and
# bench/results/overlap.png. Needs root, iproute2, iperf3, gnuplot.
#   sudo bench/run_overlap.sh [BUILD_DIR]        (default build; ~25 min)
# Environment: RATES ("1gbit 100mbit"), RTT_MS and LOSS (a round trip and a
# loss rate on every path, bench/linkem/linkem.sh; 0), HOSTS (the hosts' TCP
# settings: default or tuned, docs/operations.md "Long links"; default),
# TAUS_<rate> (τ values per rate),
# STEPS (inner steps per run, 256), DDP_STEPS_<rate>, SHARDS (2), NICE (-10),
# AGG_ARGS (more co2-aggregator flags, e.g. --stream_updates=false for the
# whole-round reference of docs/performance.md §1), KEEP=1 keeps the scratch
# directory with every log and rank report.
#
# The script runs in its own process session with nice NICE
# (ov_own_session, bench/overlap/netns.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/overlap/netns.sh"
ov_own_session "$@"
build=$(cd "${1:-build}" && pwd)
train=$build/bin/co2-train
aggregator=$build/bin/co2-aggregator
out=${OUT:-$here/results/overlap.json}
plot=${PLOT:-${out%.json}.png}
rates=${RATES:-1gbit 100mbit}
steps=${STEPS:-256}
shards=${SHARDS:-2}
workers=4
run_limit=300  # seconds: the bound of any one run

ov_session_up co2-overlap "$workers"
scratch=$OV_SCRATCH

# One run: NAME ALGO TAU STEPS. The shards are fresh for every run.
run() {
  local name=$1 algo=$2 tau=$3 n=$4 dir=$scratch/runs/$1 i
  local common=(--task=fashion-mnist --model=wide --threads=1 --batch_size=32
    --seed=1 --beta=0.5 --eval_every=0 --final_eval_examples=64
    --progress=false --hash_params=false --group_timeout=120s --update_timeout=120s
    --steps="$n" --tau="$tau" --role=worker --worker=0 --apply=boundary)
  mkdir -p "$dir"
  # shellcheck disable=SC2086  # AGG_ARGS: several flags
  ov_start_shards "$dir" "$shards" "$run_limit" "$aggregator" ${AGG_ARGS:-}
  local worker_pids=()
  for ((i = 0; i < workers; i++)); do
    local args=("${common[@]}")
    if [ "$algo" = local ]; then
      # No communication: four independent one-worker jobs (ddp with one
      # rank has no group and no aggregator), same processes and CPU load.
      args+=(--algo=ddp --workers=1 --run_dir="$dir/w$i")
    else
      args+=(--algo="$algo" --workers="$workers" --worker="$i"
        --run_dir="$dir" --job="overlap-$name"
        --aggregators="$(ov_agg_list "$shards")"
        --group_address="$(ov_worker_addr "$i")")
    fi
    mkdir -p "$dir/w$i"
    ip netns exec "$OV_PREFIX-w$i" timeout "$run_limit" "$train" "${args[@]}" \
      >"$dir/w$i/log" 2>&1 &
    worker_pids+=($!)
  done
  local failed=0
  for i in "${!worker_pids[@]}"; do
    wait "${worker_pids[$i]}" || { failed=1; tail -5 "$dir/w$i/log" >&2; }
  done
  ov_stop_shards
  if [ "$failed" = 1 ]; then echo "run $name failed" >&2; return 1; fi
  if [ "$algo" = local ]; then
    for ((i = 0; i < workers; i++)); do cp "$dir/w$i/rank-0-0.json" "$dir/rank-$i-0.json"; done
  fi
  echo "  $name done" >&2
}

# Link bandwidth as iperf3 sees it, worker 0 to the aggregator (Mbit/s).
measure_link() {
  ip netns exec "$OV_PREFIX-agg" timeout 30 iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
  local server=$!
  ov_await_port "$OV_PREFIX-agg" 5299
  ip netns exec "$OV_PREFIX-w0" timeout 20 iperf3 -c "$OV_AGG_ADDR" -p 5299 -t 3 -J |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e6)'
  wait "$server" || true
}

for rate in $rates; do
  ov_link "$workers" "$rate" "${RTT_MS:-0}" "${LOSS:-0}" "${HOSTS:-default}" \
    "$scratch/link-$rate.json"
  echo "link $rate" >&2
  measure_link >"$scratch/iperf-$rate"
  case $rate in
    100mbit) taus=${TAUS_100mbit:-16 32 64}; ddp_steps=${DDP_STEPS_100mbit:-8} ;;
    *) taus=$(eval echo "\${TAUS_$rate:-2 4 8 16 32 64}"); ddp_steps=$(eval echo "\${DDP_STEPS_$rate:-16}") ;;
  esac
  # The reference runs first and last; the ratios use the mean of the two,
  # and their difference shows how much the machine's load drifted.
  run "$rate-local-first" local "$steps" "$steps"
  run "$rate-ddp" ddp "$steps" "$ddp_steps"
  for tau in $taus; do
    run "$rate-co2-tau$tau" co2 "$tau" "$steps"
    run "$rate-slowmo-tau$tau" slowmo "$tau" "$steps"
  done
  run "$rate-local-last" local "$steps" "$steps"
done

# The model of a round's update time follows the shards' setting.
model=()
case " ${AGG_ARGS:-} " in *" --stream_updates=false "*) model=(--whole_rounds) ;; esac
python3 "$here/overlap/summarize.py" --scratch="$scratch" --rates="$rates" \
  --out="$out" --plot="$plot" --command="bench/run_overlap.sh${1:+ $1}" \
  --shards="$shards" "${model[@]}"
