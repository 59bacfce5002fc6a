#!/bin/bash
# Bytes per training sample, ddp against co2 with fp32, bf16 and int8
# uplinks, at τ = 8 and 12 (docs/performance.md §4). Writes
# bench/results/bytes.json.
#   bench/run_bytes.sh [BUILD_DIR]       (default build; ~10 s)
# When BUILD_DIR/bin/co2-train (or $CO2_TRAIN) exists, a short
# Fashion-MNIST run per algorithm (TRAIN_STEPS=64 inner steps) cross-checks
# the figures with the bytes_sent of its --report.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
out=${OUT:-$here/results/bytes.json}
scratch=$(mktemp -d /tmp/co2-bytes-bench-XXXXXX)
trap 'rm -rf "$scratch"' EXIT

"$build/bench/bytes_bench" --scratch="$scratch/rendezvous" \
  --out="$scratch/bytes.json" ${BYTES_FLAGS:-}

train=${CO2_TRAIN:-$build/bin/co2-train}
if [ -x "$train" ] && [ "${SKIP_TRAIN:-0}" != 1 ]; then
  for run in ddp:fp32 co2:fp32 co2:bf16 co2:int8; do
    algo=${run%:*}; codec=${run#*:}
    "$train" --task=fashion-mnist --algo="$algo" --codec="$codec" --workers=4 \
      --tau=8 --batch_size=32 --steps="${TRAIN_STEPS:-64}" --eval_every=0 \
      --final_eval_examples=64 --progress=false \
      --report="$scratch/train-$algo-$codec.json" >/dev/null 2>&1 || true
  done
fi

python3 - "$scratch" "$out" <<'PY'
import glob, json, os, sys

scratch, out = sys.argv[1:3]
report = json.load(open(os.path.join(scratch, "bytes.json")))
train = []
for path in sorted(glob.glob(os.path.join(scratch, "train-*.json"))):
    algo, codec = os.path.basename(path)[6:-5].split("-")
    r = json.load(open(path))
    batch = int(r["settings"].get("batch_size", 32))
    samples = sum(rank["steps"] for rank in r["ranks"]) * batch
    train.append({"algo": algo, "codec": codec, "tau": int(r["settings"].get("tau", 8)),
                  "bytes_sent": r["bytes_sent"], "samples": samples,
                  "bytes_per_sample": r["bytes_sent"] / samples})
if train:
    report["co2_train_reports"] = {
        "what": "co2-train --report bytes_sent / samples trained (fashion-mnist, "
                "4 workers); ddp counts the 4P-byte gradient buffer per step",
        "runs": train}
json.dump(report, open(out, "w"), indent=1)
open(out, "a").write("\n")
print(f"{'model':<14} {'tau':>3} {'codec':<5} {'ddp B/sample':>12} "
      f"{'co2 B/sample':>12} {'reduction':>9} {'(model)':>8}")
for r in report["results"]:
    print(f"{r['model']:<14} {r['tau']:>3} {r['codec']:<5} "
          f"{r['ddp_bytes_per_sample']:>12.0f} {r['co2_bytes_per_sample']:>12.1f} "
          f"{r['reduction']:>9.1f} {r['reduction_model']:>8.1f}")
for t in train:
    print(f"co2-train {t['algo']} {t['codec']}: {t['bytes_per_sample']:.1f} B/sample")
print(f"wrote {out}")
PY
