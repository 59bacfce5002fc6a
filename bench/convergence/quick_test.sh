#!/bin/sh
# ctest convergence_quick_test (label long): runs the convergence study in
# --quick mode into a scratch directory and checks that convergence_quick.json
# is produced, parses, and holds a finished run for every planned one.
# Usage: quick_test.sh CO2_TRAIN_BINARY
set -eu
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d /tmp/co2-convergence-quick.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
/usr/bin/python3 "$here/run.py" --quick --rerun --bin "$bin" \
  --out "$scratch/out" --work "$scratch/work" --docs ''
/usr/bin/python3 - "$scratch/out/convergence_quick.json" <<'PY'
import json, math, sys
doc = json.load(open(sys.argv[1]))
runs = doc["runs"]
assert doc["study"] == "convergence_quick" and doc["machine"]["cores"] >= 1
tasks = {r["task"] for r in runs}
assert tasks == {"fashion-mnist", "charlm"}, tasks
for r in runs:
    assert r["status"] == "ok", (r["id"], r["status"], r.get("error_tail"))
    m = r["final_metrics"][doc["tasks"][r["task"]]["metric"]]
    assert math.isfinite(m), (r["id"], m)
    assert r["curve"] and r["curve"][-1]["samples"] == r["steps"] * r["samples_per_step"], r["id"]
    assert r["command"].startswith("co2-train "), r["command"]
assert all("mean" in row for row in doc["summary"]), doc["summary"]
print("convergence_quick.json: %d runs, well-formed" % len(runs))
PY
