#!/usr/bin/env bash
# make demo: Fashion-MNIST on 4 workers (one process each, an embedded
# aggregator on 127.0.0.1), trained twice by co2-train, once with CO2 and once
# with DDP: same model, data partition, seed, inner optimizer and number of
# steps. Prints both runs, then their final test accuracy side by side.
#
#   scripts/demo.sh [BUILD_DIR] [co2-train flags for both runs...]
#
# CO2 runs co2-train's defaults (the plain average as its outer step, α = 1,
# β = 0, with carried progress; AdamW at Local-SGD's lr 2e-3) with exact sums
# on the shards (--deterministic, which applies each update at the round's
# boundary), DDP with AdamW at lr 2e-3 (its best here); see docs/outer-settings.md.
# Reports: BUILD_DIR/demo/{co2,ddp}.json.
set -euo pipefail
build=${1:-build}
shift || true
train="$build/bin/co2-train"
if [ ! -x "$train" ]; then
  echo "demo: $train is not built (make build)" >&2
  exit 1
fi
out="$build/demo"
mkdir -p "$out"

common=(--task=fashion-mnist --workers=4 --epochs=2 --seed=1 --tau=8
        --optimizer=adamw --eval_every=20)
co2=(--algo=co2 --deterministic)

echo "== CO2: 4 workers, tau=8 inner AdamW steps per round, the average of round r applied during round r+1"
"$train" "${common[@]}" "${co2[@]}" "$@" --report="$out/co2.json"
echo
echo "== DDP: 4 workers, gradients all-reduced every step"
"$train" "${common[@]}" --algo=ddp --lr=2e-3 "$@" --report="$out/ddp.json"
echo

python3 - "$out/co2.json" "$out/ddp.json" <<'PY'
import json, sys

runs = [json.load(open(path)) for path in sys.argv[1:]]
co2, ddp = runs
steps = sum(r["steps"] for r in co2["curve"])


def row(name, fmt, *values):
    print(f"  {name:<26}" + "".join(f"{fmt(v):>16}" for v in values))


s = co2["settings"]
print(f"Fashion-MNIST, {s['workers']} workers, {steps} inner steps of batch "
      f"{s['batch_size']} per worker ({s['epochs']} epochs), AdamW lr "
      f"{s['lr']} (CO2) and {ddp['settings']['lr']} (DDP)")
row("", str, "CO2", "DDP")
row("final test accuracy", lambda r: f"{100 * r['final_metrics']['test_accuracy']:.2f}%", *runs)
row("final test loss", lambda r: f"{r['final_metrics']['test_loss']:.4f}", *runs)
row("synchronisations", str, f"{co2['rounds']} (every {s['tau']})", f"{steps} (every 1)")
row("bytes sent (all workers)", lambda r: f"{r['bytes_sent'] / 1e6:.1f} MB", *runs)
row("exposed communication", lambda r: f"{100 * r['exposed_comm_fraction']:.1f}%", *runs)
row("wall time", lambda r: f"{r['wall_time_s']:.0f} s", *runs)
print("  (both runs share one machine: communication is loopback, so wall times")
print("   show the overhead of the exchanges, not the bandwidth of a real network)")
print(f"  reports: {sys.argv[1]} {sys.argv[2]}")
PY
