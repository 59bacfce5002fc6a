#!/bin/bash
# Aggregator throughput and memory (docs/performance.md §2):
# S co2-aggregator shards on loopback take N workers' rounds of P fp32
# deltas, next to iperf3 (same bytes, same N·S streams) and a Gloo
# all-reduce of the same P floats across N processes, in the same run; then
# a short run with the copy counter preloaded into a shard and a worker,
# which shows where payload bytes are copied; the shards' memory at a larger
# range (LARGE_PARAMS; needs about 10 GiB of RAM at N = 8) and with bf16 and
# int8 downlinks (the cached updates shrink with the codec), and at the
# larger range again with checkpoints on disk (CHECKPOINT_DIR, default under
# the scratch directory in /tmp). The main run also times the CPU each of
# the three spends per round (the processes' user and system time), so that
# a CPU-bound loopback shows where its time goes. Writes
# bench/results/aggregator.json.
#   bench/run_aggregator.sh [BUILD_DIR]             (default build; ~2–4 min idle)
#   WORKERS=2,4,8 PARAMS=8388608 SHARDS=2 ROUNDS=10 REPS=3 \
#   LARGE_WORKERS=2,8 LARGE_PARAMS=67108864 OUT=... \
#     bench/run_aggregator.sh build-bench
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
out=${OUT:-$here/results/aggregator.json}
scratch=$(mktemp -d /tmp/co2-aggregator-bench-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
bench="$build/bench/aggregator_bench"
aggregator="$build/bin/co2-aggregator"
iperf3=${IPERF3:-$(command -v iperf3 || true)}

"$bench" --aggregator="$aggregator" --iperf3="$iperf3" \
  --workers="${WORKERS:-2,4,8}" --params="${PARAMS:-8388608}" \
  --shards="${SHARDS:-2}" --rounds="${ROUNDS:-10}" \
  --repetitions="${REPS:-3}" --whole_round_reference \
  --scratch="$scratch/main" --out="$scratch/main.json"

# Copies: one shard, two workers, under the LD_PRELOAD counter.
"$bench" --aggregator="$aggregator" --iperf3= --gloo=false --workers=2 \
  --shards=1 --params="${COPY_PARAMS:-4194304}" --rounds=4 --repetitions=1 \
  --copy_counter="$build/bench/libco2_copy_counter.so" \
  --scratch="$scratch/copies" --out="$scratch/copies.json"

# Memory with compressed downlinks: one repetition, no references.
for downlink in bf16 int8; do
  "$bench" --aggregator="$aggregator" --iperf3= --gloo=false \
    --workers="${WORKERS:-2,4,8}" --params="${PARAMS:-8388608}" \
    --shards="${SHARDS:-2}" --rounds=4 --repetitions=1 \
    --downlink="$downlink" --scratch="$scratch/$downlink" \
    --out="$scratch/$downlink.json"
done

# Memory at a range where the process's fixed RSS and the stream buffers are
# small next to the state: 128 MiB per shard by default (about 1 GiB per
# worker process and 10 GiB in all at N = 8). Three rounds, the fewest that
# reach the steady state (two updates kept while a round accumulates).
"$bench" --aggregator="$aggregator" --iperf3= --gloo=false \
  --workers="${LARGE_WORKERS:-2,8}" --params="${LARGE_PARAMS:-67108864}" \
  --shards="${SHARDS:-2}" --rounds=3 --repetitions=1 \
  --scratch="$scratch/large" --out="$scratch/large.json"

# The same range with a checkpoint of every round on disk, as deployed
# (deploy/k8s): a shard keeps an update it has sent in its checkpoint, not in
# memory. Three rounds, as above: the third round's accumulator fills while
# two updates exist, and two steps read their gap back from disk.
"$bench" --aggregator="$aggregator" --iperf3= --gloo=false \
  --workers="${LARGE_WORKERS:-2,8}" --params="${LARGE_PARAMS:-67108864}" \
  --shards="${SHARDS:-2}" --rounds=3 --repetitions=1 \
  --checkpoint_dir="${CHECKPOINT_DIR:-$scratch/checkpoints}" \
  --scratch="$scratch/large-checkpoints" \
  --out="$scratch/large-checkpoints.json"

python3 - "$scratch/main.json" "$scratch/copies.json" "$out" "$aggregator" \
  "$bench" "$scratch/large.json" "$scratch/large-checkpoints.json" \
  "$scratch/bf16.json" "$scratch/int8.json" <<'PY'
import json, subprocess, sys

main, copies, out, aggregator, bench = sys.argv[1:6]
report = json.load(open(main))

def per_shard(run, key):
    """`key` of every shard of every repetition of `run`."""
    return [s[key] for rep in run["shards"] for s in rep]

def memory_runs(path):
    """The memory figures of a run without references."""
    return [{"workers": run["workers"],
             "peak_over_range": per_shard(run, "peak_over_range"),
             "peak_minus_idle_over_range": per_shard(run, "peak_minus_idle_over_range"),
             "round_s_median": run["aggregator"]["round_s_median"]}
            for run in json.load(open(path))["runs"]]

def large_range(path):
    large = json.load(open(path))
    return {"params": large["config"]["params"],
            "fp32_range_bytes": large["runs"][0]["shards"][0][0]["fp32_range_bytes"],
            "runs": memory_runs(path)}

report["memory_large_range"] = large_range(sys.argv[6])
report["memory_large_range_checkpoints"] = large_range(sys.argv[7])
report["memory_by_downlink"] = {}
for path in sys.argv[8:]:
    codec = json.load(open(path))["config"]["downlink_codec"]
    report["memory_by_downlink"][codec] = memory_runs(path)
shard = json.load(open(copies))["runs"][0]["shards"][0][0]
counted = shard["copies"]

def symbolise(site, binary):
    """The site's function: its symbol, or the outermost function that
    addr2line finds at its offset in `binary` (the process's executable)."""
    if site["symbol"] or site["object"].split("/")[-1] not in (
            "co2-aggregator", "exe", "aggregator_bench"):
        return site["symbol"]
    try:
        lines = subprocess.run(["addr2line", "-f", "-C", "-i", "-e", binary,
                                site["offset"]], capture_output=True,
                               text=True).stdout.splitlines()
        return lines[-2] if len(lines) >= 2 else ""
    except OSError:
        return ""

def role(site, symbol):
    if "_M_append" in symbol:
        return "seed: protobuf parses the Seed stream's anchor chunks (fp32 A_0, once per job) into std::string"
    if "ForEach" in symbol:
        return "uplink: part of a contribution payload in pieces assembled before it is read (common/payload_pieces)"
    if "EpsCopyOutputStream" in symbol:
        return "downlink: protobuf serialises the anchor chunks of a Fetch into gRPC slices"
    if "EncodeUpdateLocked" in symbol:
        return "downlink: Encode(fp32) of U into the payload shared by every stream, once per round"
    if "Fetch" in symbol or "AnchorSnapshot" in symbol:
        return "anchor snapshot for a worker's Fetch"
    return "other"

sites = []
for site in sorted(counted["sites"], key=lambda s: -s["bytes"]):
    symbol = symbolise(site, aggregator)
    sites.append({"role": role(site, symbol), "object": site["object"].split("/")[-1],
                  "symbol": symbol, "bytes": site["bytes"], "calls": site["calls"]})
received = shard["payload_bytes_received"]
# Contributions only: the seed (params fp32 values, once) goes through the
# typed Seed stream, which protobuf parses.
seed = json.load(open(copies))["config"]["params"] * 4
uplink_memcpy = sum(s["bytes"] for s in sites if s["role"].startswith("uplink"))
report["copy_profile"] = {
    "what": "one shard, 2 workers, 4 rounds + the seed, fp32; memcpy/memmove "
            "bytes by caller (LD_PRELOAD bench/copy_counter.cc) and bytes "
            "through socket system calls (the kernel's copy)",
    "params": json.load(open(copies))["config"]["params"],
    "payload_bytes_received": received,
    "socket_bytes_received": counted["socket_bytes_received"],
    "socket_bytes_sent": counted["socket_bytes_sent"],
    "memcpy_bytes_total": counted["memcpy_bytes"],
    "memcpy_bytes_in_small_calls": counted["memcpy_bytes_in_small_calls"],
    "seed_bytes_received": seed,
    "uplink_user_space_copies_per_payload_byte":
        round(uplink_memcpy / (received - seed), 4),
    "uplink_kernel_copies_per_payload_byte": round(counted["socket_bytes_received"] / received, 4),
    "sites": sites,
}

# Worker 0 of the same run: what a worker copies per payload byte it sends
# (contributions) and receives (updates). Sites are labelled by caller only:
# protobuf's copies are put down to joining (seed, fetch) because
# contributions and updates bypass protobuf; bench/smoke_test.sh checks the
# total by size, which a protobuf copy of the payloads would break.
def client_role(symbol):
    if "SeedAnchor" in symbol:
        return "seed: the anchor's fp32 encode (once per job, one worker)"
    if "Push" in symbol:
        return "uplink: Encode(fp32) of the delta into the send buffer (the codec pass)"
    if "EpsCopyOutputStream" in symbol:
        # Contributions bypass protobuf (client/worker_wire.h); the Seed
        # stream's anchor chunks do not.
        return "seed: protobuf serialises the anchor chunks of the Seed stream (once per job, one worker)"
    if "_M_append" in symbol:
        return "join: protobuf parses the anchor chunks a Fetch returns (once per worker that did not seed)"
    if "ForEach" in symbol:
        return "downlink: part of an update payload in pieces assembled before it is read (common/payload_pieces)"
    return "other"

worker = json.load(open(copies))["runs"][0]["client_copies"][0]
wsites = []
for site in sorted(worker["copies"]["sites"], key=lambda s: -s["bytes"]):
    symbol = symbolise(site, bench)
    wsites.append({"role": client_role(symbol), "object": site["object"].split("/")[-1],
                   "symbol": symbol, "bytes": site["bytes"], "calls": site["calls"]})
def per_byte(prefix, total):
    return round(sum(s["bytes"] for s in wsites if s["role"].startswith(prefix)) / total, 4)
report["client_copy_profile"] = {
    "what": "worker 0 of the copy_profile run: memcpy/memmove bytes by caller "
            "and bytes through socket system calls",
    "payload_bytes_sent": worker["payload_bytes_sent"],
    "payload_bytes_received": worker["payload_bytes_received"],
    "socket_bytes_sent": worker["copies"]["socket_bytes_sent"],
    "socket_bytes_received": worker["copies"]["socket_bytes_received"],
    "memcpy_bytes_total": worker["copies"]["memcpy_bytes"],
    "memcpy_bytes_in_small_calls": worker["copies"]["memcpy_bytes_in_small_calls"],
    "uplink_user_space_copies_per_payload_byte": per_byte("uplink", worker["payload_bytes_sent"]),
    "downlink_user_space_copies_per_payload_byte": per_byte("downlink", worker["payload_bytes_received"]),
    "sites": wsites,
}
json.dump(report, open(out, "w"), indent=1)
open(out, "a").write("\n")
print(f"{'N':>3} {'round s':>8} {'goodput GB/s':>12} {'/iperf3':>8} "
      f"{'gloo/agg':>8} {'CPU s':>6} {'cores':>5} {'iperf3 CPU/agg':>14} "
      f"{'peak/range':>10} {'(−idle)':>8}")
for run in report["runs"]:
    peaks = per_shard(run, "peak_over_range")
    excess = per_shard(run, "peak_minus_idle_over_range")
    r = run["ratios"]
    fmt = lambda x, w: f"{x:>{w}.2f}" if x is not None else f"{'-':>{w}}"
    print(f"{run['workers']:>3} {run['aggregator']['round_s_median']:>8.3f} "
          f"{run['aggregator']['goodput_bytes_per_s_median'] / 1e9:>12.2f} "
          f"{fmt(r['goodput_over_iperf3'], 8)} "
          f"{fmt(r['gloo_round_over_aggregator_round'], 8)} "
          f"{run['cpu_s_per_round']['aggregator']['total']:>6.3f} "
          f"{run['cores_busy']['aggregator']:>5.2f} "
          f"{fmt(r['iperf3_cpu_over_aggregator_cpu'], 14)} "
          f"{max(peaks):>10.1f} {max(excess):>8.1f}")
large = report["memory_large_range"]
print(f"fp32 at {large['fp32_range_bytes'] >> 20} MiB per shard, peak/range (−idle): " + ", ".join(
    f"N={r['workers']} {max(r['peak_over_range']):.2f} "
    f"({max(r['peak_minus_idle_over_range']):.2f})" for r in large["runs"]))
for codec, runs in report["memory_by_downlink"].items():
    print(f"{codec} downlink, peak/range (−idle): " + ", ".join(
        f"N={r['workers']} {max(r['peak_over_range']):.1f} "
        f"({max(r['peak_minus_idle_over_range']):.1f})" for r in runs))
cp = report["copy_profile"]
print(f"uplink copies per payload byte: kernel {cp['uplink_kernel_copies_per_payload_byte']}, "
      f"user space before the accumulator {cp['uplink_user_space_copies_per_payload_byte']} "
      f"(contributions; then one decode-accumulate pass)")
wp = report["client_copy_profile"]
print(f"worker copies per payload byte: uplink {wp['uplink_user_space_copies_per_payload_byte']} "
      f"(the fp32 encode), downlink {wp['downlink_user_space_copies_per_payload_byte']} "
      f"(updates are applied from gRPC's slices)")
print(f"wrote {out}")
PY
