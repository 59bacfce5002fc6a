#!/usr/bin/env bash
# Bit-reproducible training (docs/algorithm.md, "Order-independent sums"):
# co2-train --deterministic (co2's default outer settings, with carried
# progress) with 4 worker processes and the embedded aggregator, run twice
# with the same seed, ends with the same parameters: every rank's final
# FNV-1a hash is the same within a run and across the two runs.
#
# Usage: reproducible_training_test.sh BUILD_DIR
set -euo pipefail
BUILD=$(cd "$1" && pwd)
WORK=$(mktemp -d /tmp/co2-repro-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

run() {
  timeout -s KILL 600 "$BUILD/bin/co2-train" --task=fashion-mnist \
    --workers=4 --tau=8 --steps=96 --seed=3 --threads=1 --algo=co2 \
    --optimizer=adamw --eval_every=0 \
    --final_eval_examples=1000 --progress=false --hash_params --deterministic \
    --report="$WORK/$1.json" >"$WORK/$1.out" 2>&1 ||
    { cat "$WORK/$1.out" >&2; exit 1; }
}
run first
run second
/usr/bin/python3 - "$WORK/first.json" "$WORK/second.json" <<'PY'
import json, sys
hashes = []
for path in sys.argv[1:]:
    report = json.load(open(path))
    ranks = {r["final_hash"] for r in report["ranks"]}
    if len(ranks) != 1:
        sys.exit(f"{path}: ranks end with different models: {sorted(ranks)}")
    hashes.append(ranks.pop())
if hashes[0] != hashes[1]:
    sys.exit(f"two runs with the same seed ended with {hashes[0]} and {hashes[1]}")
print(f"both runs, every rank: final_hash {hashes[0]}")
PY
