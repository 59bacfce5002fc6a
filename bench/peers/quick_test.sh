#!/bin/sh
# ctest peers_quick_test (label long): runs bench/peers/run.py --quick with a
# fresh run cache into a scratch directory and checks peers_quick.json: every
# system has a row, measured or with the error that stopped it; co2's and
# DDP's rows are measured, finite, with bytes on the wire and a curve.
# Needs root (network namespaces); makes bench/peers/venv.sh's venv once.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: bench/peers needs root for network namespaces" >&2
  exit 77
fi
scratch=$(mktemp -d /tmp/co2-peers-quick.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
python3 "$here/run.py" --quick --cache "$scratch/cache" --out "$scratch/peers_quick.json"
python3 - "$scratch/peers_quick.json" <<'PY'
import json, math, sys
doc = json.load(open(sys.argv[1]))
assert doc["quick"] and doc["machine"]["cores"] >= 1, doc["machine"]
assert doc["versions"]["torch"] and doc["versions"]["co2"], doc["versions"]
rows = {r["system"]: r for r in doc["rows"]}
want = {"local", "ddp", "torchft-diloco", "torchft-streaming", "torchft-localsgd",
        "hivemind", "co2", "co2-diloco", "co2-a0.5", "co2-int8"}
assert set(rows) == want, set(rows) ^ want
for system, r in rows.items():
    if "error" in r:
        assert system not in ("local", "ddp", "co2", "co2-diloco", "co2-a0.5", "co2-int8"), \
            (system, r["error"])
        continue
    assert math.isfinite(r["final_val_loss"]) and r["final_val_loss"] < 5.6, (system, r)
    assert r["curve"][-1]["samples"] == r["steps"] * 4 * 4, (system, r["curve"][-1])
    if system != "local":
        assert r["wire_bytes_per_worker"] > 0 and 0 < r["vs_local"], (system, r)
        assert "time_to_target_s" in r, system
for system in ("ddp", "co2", "co2-diloco", "co2-a0.5", "co2-int8"):
    assert rows[system]["workers_agree"], system
print("peers_quick.json: %d rows, well-formed" % len(rows))
PY
