#!/bin/bash
# Kernels in GB/s next to memcpy of the same size, in the same run
# (docs/performance.md §3). Writes bench/results/kernels.json.
#   bench/run_kernels.sh [BUILD_DIR]           (default build)
#   REPS=5 MIN_TIME=0.2 OUT=... bench/run_kernels.sh build-bench
# Each benchmark runs REPS times, interleaved at random with the others, and
# the report keeps the medians; GB/s counts every byte read and written
# over the process's CPU time.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
reps=${REPS:-5}
min_time=${MIN_TIME:-0.2}
out=${OUT:-$here/results/kernels.json}
filter=${FILTER:-.}
raw=$(mktemp /tmp/co2-kernels-XXXXXX.json)
trap 'rm -f "$raw"' EXIT

"$build/bench/kernels_bench" --benchmark_repetitions="$reps" \
  --benchmark_enable_random_interleaving=true \
  --benchmark_min_time="$min_time" --benchmark_filter="$filter" \
  --benchmark_out="$raw" --benchmark_out_format=json >&2

python3 - "$raw" "$out" "$build" <<'PY'
import json, os, platform, statistics, subprocess, sys

raw, out, build = sys.argv[1:4]
data = json.load(open(raw))

def lscpu(field):
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"

def cache(key):
    try:
        for line in open(os.path.join(build, "CMakeCache.txt")):
            if line.startswith(key + ":"):
                return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""

compiler = cache("CMAKE_CXX_COMPILER") or "c++"
try:
    compiler_version = subprocess.run([compiler, "--version"], capture_output=True,
                                      text=True).stdout.splitlines()[0]
except (OSError, IndexError):
    compiler_version = compiler
build_type = cache("CMAKE_BUILD_TYPE") or "RelWithDebInfo"
flags = cache("CMAKE_CXX_FLAGS_" + build_type.upper())
mem_kib = int(open("/proc/meminfo").readline().split()[1])
machine = {
    "cpu": lscpu("Model name"),
    "cores": os.cpu_count(),
    "memory_gib": round(mem_kib / 2**20, 1),
    "kernel": platform.system() + " " + platform.release(),
    "compiler": compiler_version,
    "build_type": build_type,
    "flags": flags.strip(),
    "caches": data["context"].get("caches", []),
    "load_average": open("/proc/loadavg").read().split()[:3],
}

runs = {}
for b in data["benchmarks"]:
    if b.get("run_type") != "iteration":
        continue
    runs.setdefault(b["run_name"], []).append(b)

def kernel_and_size(name):
    parts = name.split("/")
    return "/".join(parts[:-1]).replace("BM_", ""), int(parts[-1])

memcpy = {}
memcpy_bytes = {}
for name, reps in runs.items():
    kernel, size = kernel_and_size(name)
    if kernel == "Memcpy":
        memcpy[size] = statistics.median(r["bytes_per_second"] for r in reps)
        memcpy_bytes[size] = reps[0].get("bytes_per_iteration")

notes = {
    "ExactAccumulate/fp32": "the shard's exact, order-independent sum "
                            "(server/job/exact_sum.h): an 8-byte sum per "
                            "element, read and written",
    "Validate/int8": "reads only the 4-byte scale of each 1,024 values; "
                     "GB/s is per payload byte validated",
    "CheckStepFits": "the largest |x| of mean delta, m and A, read before "
                     "each chunk's outer step (server/job/outer_optimizer.h)",
}
results = []
for name, reps in runs.items():
    kernel, size = kernel_and_size(name)
    gbs = [r["bytes_per_second"] / 1e9 for r in reps]
    median = statistics.median(gbs)
    entry = {
        "kernel": kernel,
        "fp32_range_bytes": size,
        "in_cache": size <= (1 << 20),
        "bytes_per_iteration": reps[0].get("bytes_per_iteration"),
        "gb_per_s_median": round(median, 3),
        "gb_per_s": [round(g, 3) for g in gbs],
        "memcpy_gb_per_s_median": round(memcpy[size] / 1e9, 3),
        "ratio_to_memcpy": round(median * 1e9 / memcpy[size], 3),
        # Time for the fp32 range over memcpy's time for it (not per byte).
        "time_ratio_to_memcpy": round(
            (memcpy[size] / memcpy_bytes[size]) /
            (median * 1e9 / reps[0].get("bytes_per_iteration")), 3),
    }
    if kernel != "Memcpy":
        entry["meets_target"] = entry["ratio_to_memcpy"] >= 0.5
    if kernel in notes:
        entry["note"] = notes[kernel]
    results.append(entry)

family = ["Memcpy", "Accumulate", "ExactAccumulate", "OverflowCheck", "Decode", "Encode", "EncodeWithFeedback",
          "Validate", "OuterStep", "CheckStepFits"]
codecs = ["", "fp32", "bf16", "int8"]
def order(r):
    parts = r["kernel"].split("/") + [""]
    return (family.index(parts[0]), codecs.index(parts[1]), r["fp32_range_bytes"])
results.sort(key=order)

report = {
    "what": "co2 kernels in GB/s (all bytes read and written, over CPU time) "
            "next to memcpy of the same fp32 range in the same run; target: "
            "ratio_to_memcpy >= 0.5 (within 2x)",
    "machine": machine,
    "repetitions": len(next(iter(runs.values()))),
    "results": results,
}
with open(out, "w") as f:
    json.dump(report, f, indent=1)
    f.write("\n")
width = max(len(r["kernel"]) for r in results)
print(f"{'kernel':<{width}} {'size':>9} {'GB/s':>8} {'memcpy':>8} {'ratio':>6} {'time':>6}")
for r in results:
    flag = "" if r.get("meets_target", True) else "  < 0.5"
    print(f"{r['kernel']:<{width}} {r['fp32_range_bytes'] >> 20:>7}Mi "
          f"{r['gb_per_s_median']:>8.2f} {r['memcpy_gb_per_s_median']:>8.2f} "
          f"{r['ratio_to_memcpy']:>6.2f} {r['time_ratio_to_memcpy']:>6.2f}{flag}")
print(f"wrote {out}")
PY
