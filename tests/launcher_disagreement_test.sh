#!/usr/bin/env bash
# co2-train exits non-zero when the ranks end with different models, naming
# every rank's final hash: worker 1 flips one bit of its final model after
# its check against the shards (--inject_fault=1:flip_final_bit), as a rank
# with a wrong model would end. The same run without the fault exits 0.
#
# Usage: launcher_disagreement_test.sh BUILD_DIR
set -euo pipefail
TRAIN=$(cd "$1" && pwd)/bin/co2-train
WORK=$(mktemp -d /tmp/co2-disagreement.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# run NAME [flags]: a fresh run directory each (the Gloo store is per run).
run() {
  local name=$1
  shift
  timeout -s KILL 240 "$TRAIN" --task=fashion-mnist --workers=2 --tau=4 \
    --steps=24 --threads=1 --progress=false --eval_every=0 \
    --final_eval_examples=200 --report="$WORK/report.json" \
    --run_dir="$WORK/$name" "$@" \
    >"$WORK/out" 2>&1
}

run undisturbed || fail "the undisturbed run failed: $(cat "$WORK/out")"
grep -q "parameters identical on every rank after every boundary: yes" "$WORK/out" ||
  fail "the undisturbed run does not say its ranks agree: $(cat "$WORK/out")"

status=0
run flipped --inject_fault=1:flip_final_bit || status=$?
cat "$WORK/out"
(( status != 0 )) || fail "co2-train exited 0 with a rank holding another model"
grep -q "final models differ: worker 0 rank 0 [0-9a-f]\{16\}, worker 1 rank 0 [0-9a-f]\{16\}" "$WORK/out" ||
  fail "the error does not name both ranks and their hashes"
/usr/bin/python3 - "$WORK/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
if r["params_identical"] is not False or "final models differ" not in r["first_difference"]:
    sys.exit(f"the report does not mark the disagreement: {r.get('first_difference')}")
PY
echo PASS
