#!/bin/bash
# When a co2 worker applies the update a round owes (docs/algorithm.md,
# "Applying an update when it arrives"), behind slow links: 4 workers, each
# in its own network namespace behind a tc-tbf-shaped link, the shards
# unshaped (bench/overlap/netns.sh), train Fashion-MNIST's CNN with DiLoCo
# (blocking), co2 applying at the boundary and co2 applying on arrival, from
# the same seeds and for the same inner steps; every run has fresh shards.
# Writes bench/results/arrival.json (bench/overlap/arrival.py): per run the
# final test accuracy, the share of time waiting for the network and, for
# arrival, the inner steps into each round at which its update was applied.
# Needs root, iproute2.
#   sudo bench/run_arrival.sh [BUILD_DIR]
# Environment: TASK (fashion-mnist, or charlm: the byte-LSTM on 8 windows of
# 16 bytes per step, as the convergence study runs it), RATES ("1gbit
# 100mbit"), TAUS ("48 128"), SEEDS ("1 2 3"), STEPS (inner steps per
# worker; 1920 for fashion-mnist, two epochs at batch 16; 2688 for charlm,
# the study's), SHARDS (2),
# ALPHA (the outer learning rate of co2-boundary and co2-arrival, which run
# eager updates: 0.9, the convergence study's best for them at τ = 48),
# VARIANTS ("diloco co2-boundary co2-arrival"; also co2-default, co2-train's
# defaults for co2 with no outer flags (the plain average with carried
# progress, at Local-SGD's lr); co2-byL, the defaults applying each update by
# inner step L of its round at the latest (--apply_by_step=L); co2-nest-byL,
# the same with DiLoCo's outer step (--alpha=0.7 --beta=0.9
# --momentum=nesterov) at DiLoCo's lr; co2-avg-carry, the same spelled out: --alpha=1
# --beta=0 --carry_progress --eager=false at Local-SGD's lr; co2-aX, eager
# updates at --alpha=X; co2-det, the defaults with --deterministic, which
# applies each update at the boundary; co2-det-aX, --deterministic with eager
# updates at --alpha=X; co2-det-nocarry-aX, --deterministic at --alpha=X
# without carried progress; localsgd, Local-SGD's blocking average). The
# eager and no-carry variants run at the convergence study's best lr for co2
# with eager updates.
# NICE (-10), KEEP=1 keeps the scratch directory. Runs already in OUT are
# kept (the study resumes), unless RERUN=1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OV_PREFIX=co2arr
source "$here/overlap/netns.sh"
ov_own_session "$@"
build=$(cd "${1:-build}" && pwd)
train=$build/bin/co2-train
aggregator=$build/bin/co2-aggregator
out=${OUT:-$here/results/arrival.json}
task=${TASK:-fashion-mnist}
case $task in
  fashion-mnist) task_flags=(--batch_size=16 --final_eval_examples=10000)
                 steps=${STEPS:-1920} localsgd_lr=2e-3 eager_lr=4e-3 diloco_lr=5e-4 ;;
  charlm) task_flags=(--batch_size=8 --seq_len=16 --final_eval_examples=1000)
          steps=${STEPS:-2688} localsgd_lr=8e-3 eager_lr=3.2e-2 diloco_lr=2e-3 ;;
  *) echo "TASK must be fashion-mnist or charlm, got $task" >&2; exit 2 ;;
esac
rates=${RATES:-1gbit 100mbit}
taus=${TAUS:-48 128}
seeds=${SEEDS:-1 2 3}
shards=${SHARDS:-2}
alpha=${ALPHA:-0.9}
variants=${VARIANTS:-diloco co2-boundary co2-arrival}
workers=4
run_limit=1200  # seconds: the bound of any one run

ov_session_up co2-arrival "$workers"
scratch=$OV_SCRATCH

# One run: ID TAU SEED [co2-train flags...]; its rank reports go to
# $scratch/ID and are added to OUT at once.
run() {
  local id=$1 tau=$2 seed=$3 dir=$scratch/$1
  shift 3
  if [ "${RERUN:-0}" != 1 ] && /usr/bin/python3 "$here/overlap/arrival.py" has \
      --out="$out" --id="$id"; then
    echo "  $id: cached" >&2
    return 0
  fi
  local common=(--task="$task" "${task_flags[@]}" --workers="$workers"
    --threads=1 --seed="$seed" --tau="$tau" --steps="$steps"
    --eval_every=0 --progress=false
    --hash_params=false --group_timeout=300s --update_timeout=300s
    --run_dir="$dir" --job="arr-$id" "$@")
  rm -rf "$dir"
  mkdir -p "$dir"
  if ! ov_train "$dir" "$workers" "$shards" "$run_limit" "$train" "$aggregator" \
      "${common[@]}"; then
    echo "run $id failed" >&2
    return 1
  fi
  /usr/bin/python3 "$here/overlap/arrival.py" add --out="$out" --id="$id" \
    --scratch="$dir" --workers="$workers" \
    --command="TASK=$task bench/run_arrival.sh: co2-train ${common[*]}"
  echo "  $id done" >&2
}

for rate in $rates; do
  ov_link "$workers" "$rate" "${RTT_MS:-0}" "${LOSS:-0}" "${HOSTS:-default}" \
    "$OV_SCRATCH/link-$rate.json"
  for tau in $taus; do
    for seed in $seeds; do
      base="$task/$rate/tau$tau/seed$seed"
      for variant in $variants; do
        case $variant in
          diloco) flags=(--algo=diloco) ;;
          localsgd) flags=(--algo=localsgd) ;;
          co2-avg-carry) flags=(--algo=co2 --alpha=1 --beta=0 --carry_progress --eager=false
                                --lr="$localsgd_lr") ;;
          co2-default) flags=(--algo=co2) ;;
          co2-by*) flags=(--algo=co2 --apply_by_step="${variant#co2-by}") ;;
          co2-nest-by*) flags=(--algo=co2 --alpha=0.7 --beta=0.9 --momentum=nesterov
                               --lr="$diloco_lr" --apply_by_step="${variant#co2-nest-by}") ;;
          co2-det) flags=(--algo=co2 --deterministic) ;;
          co2-det-a*) flags=(--algo=co2 --deterministic --alpha="${variant#co2-det-a}" --eager
                             --lr="$eager_lr") ;;
          co2-det-nocarry-a*) flags=(--algo=co2 --deterministic
                                     --alpha="${variant#co2-det-nocarry-a}"
                                     --carry_progress=false --lr="$eager_lr") ;;
          co2-a*) flags=(--algo=co2 --alpha="${variant#co2-a}" --eager --lr="$eager_lr") ;;
          co2-boundary) flags=(--algo=co2 --alpha="$alpha" --eager --lr="$eager_lr"
                               --apply=boundary) ;;
          co2-arrival) flags=(--algo=co2 --alpha="$alpha" --eager --lr="$eager_lr"
                              --apply=arrival) ;;
          *) echo "unknown variant $variant" >&2; exit 2 ;;
        esac
        run "$base/$variant" "$tau" "$seed" "${flags[@]}"
      done
    done
  done
done
/usr/bin/python3 "$here/overlap/arrival.py" table --out="$out"
