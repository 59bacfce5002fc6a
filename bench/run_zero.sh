#!/usr/bin/env bash
# co2's memory and traffic per local rank: each of a node's L local ranks
# exchanging its own slice of the model (replicated, and FSDP2) against
# local rank 0 alone exchanging the whole model, at L = 1, 2, 4, each point
# also run without co2 (docs/results/sharding-memory.md). Writes
# bench/results/zero_memory.json (OUT overrides).
#
#   bash bench/run_zero.sh                           # 503M params (30 x Linear(4096, 4096))
#   bash bench/run_zero.sh --hidden 1024 --layers 8  # 8.4M params: the smoke size, ~3 min
#
# Arguments go to bench/python/zero_memory.py (--modes, --local_ranks,
# --budget_gib, --timeout, ...). A point estimated above --budget_gib (20)
# is not started; its row comes from the accounting. BUILD: the build tree
# (default build). PY: a Python with torch >= 2.6 (FSDP2); default the venv
# of scripts/torch_venv.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${BUILD:-$root/build}" && pwd)
py=${PY:-$("$root/scripts/torch_venv.sh" venv)}
out=${OUT:-$here/results/zero_memory.json}

export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
export CO2_BUILD_DIR="$build"
# One thread per rank: L ranks and S shards share the cores.
export OMP_NUM_THREADS=1
export ZERO_MEMORY_COMMAND="bash bench/run_zero.sh${*:+ $*}"
exec "$py" "$here/python/zero_memory.py" --out "$out" "$@"
