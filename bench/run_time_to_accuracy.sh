#!/bin/bash
# Time to accuracy behind slow links (docs/results/time-to-accuracy.md).
# 4 workers, each in its own network namespace behind a tc-tbf-shaped link,
# and the aggregator shards in another (bench/overlap/netns.sh), train
# Fashion-MNIST's CNN with ddp, localsgd, diloco and co2 (co2-train's
# defaults: each algorithm's inner lr from the convergence study, co2 with
# the plain average and carried progress, applying each update on arrival),
# each from the same seed.
# Every algorithm but ddp runs twice ddp's steps, so that each has the time
# to pass ddp's final accuracy if it can. Writes
# bench/results/time_to_accuracy.json and time_to_accuracy.png: validation
# accuracy (1,000 test images) against training time, and how long each
# takes to reach ddp's final accuracy minus 0.5 points. Needs root,
# iproute2, gnuplot.
#   sudo bench/run_time_to_accuracy.sh [BUILD_DIR]      (default build; ~3 min)
# Environment: RATE (100mbit), TAU (24), STEPS (ddp's inner steps, 1536),
# SHARDS (2), NICE (-10), KEEP=1 keeps the scratch directory. It runs in
# its own process session with nice NICE (ov_own_session,
# bench/overlap/netns.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OV_PREFIX=co2tta
source "$here/overlap/netns.sh"
ov_own_session "$@"
build=$(cd "${1:-build}" && pwd)
train=$build/bin/co2-train
aggregator=$build/bin/co2-aggregator
out=${OUT:-$here/results/time_to_accuracy.json}
plot=${PLOT:-${out%.json}.png}
rate=${RATE:-100mbit}
tau=${TAU:-24}
steps=${STEPS:-1536}
shards=${SHARDS:-2}
workers=4
run_limit=900  # seconds: the bound of any one run

ov_session_up co2-tta "$workers"
scratch=$OV_SCRATCH
ov_link "$workers" "$rate" "${RTT_MS:-0}" "${LOSS:-0}" "${HOSTS:-default}" \
  "$scratch/link-$rate.json"

# One run: ALGO STEPS [co2-train flags...]. Fresh shards for every run.
run() {
  local algo=$1 n=$2 dir=$scratch/$1
  shift 2
  # About 16 evaluations per run, whatever its length.
  local eval_every=$(((n / tau + 15) / 16))
  local common=(--task=fashion-mnist --algo="$algo" --workers="$workers"
    --threads=1 --batch_size=16 --seed=1 --tau="$tau" --steps="$n"
    --eval_every="$eval_every" --eval_examples=1000 --final_eval_examples=0
    --progress=false --hash_params=false --group_timeout=300s
    --update_timeout=300s --run_dir="$dir" --job="tta-$algo" "$@")
  mkdir -p "$dir"
  if ! ov_train "$dir" "$workers" "$shards" "$run_limit" "$train" "$aggregator" \
      "${common[@]}"; then
    echo "run $algo failed" >&2
    return 1
  fi
  echo "  $algo done" >&2
}

echo "link $rate, tau $tau" >&2
run ddp "$steps"
run localsgd $((2 * steps))
run diloco $((2 * steps))
run co2 $((2 * steps))

/usr/bin/python3 "$here/overlap/time_to_accuracy.py" --scratch="$scratch" \
  --algos="ddp localsgd diloco co2" --out="$out" --plot="$plot" \
  --rate="$rate" --tau="$tau" --steps="$steps" \
  --command="bench/run_time_to_accuracy.sh${1:+ $1}"
