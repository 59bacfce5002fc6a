#!/bin/bash
# ctest `bench_smoke` (label long): every benchmark in a tiny configuration,
# writing to a scratch directory, so that they do not rot. Checks that each
# report is well-formed JSON with its main figures; asserts no speed.
#   bench/smoke_test.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
scratch=$(mktemp -d /tmp/co2-bench-smoke-XXXXXX)
trap 'rm -rf "$scratch"' EXIT

REPS=1 MIN_TIME=0.01 OUT="$scratch/kernels.json" \
  "$here/run_kernels.sh" "$build" >/dev/null
WORKERS=2 PARAMS=1048576 SHARDS=2 ROUNDS=2 REPS=1 COPY_PARAMS=262144 \
  OUT="$scratch/aggregator.json" "$here/run_aggregator.sh" "$build" >/dev/null
SKIP_TRAIN=1 OUT="$scratch/bytes.json" \
  BYTES_FLAGS="--models=tiny:300000 --tau=8 --rounds=2 --ddp_steps=1" \
  "$here/run_bytes.sh" "$build" >/dev/null

python3 - "$scratch" <<'PY'
import json, os, sys
d = sys.argv[1]
k = json.load(open(os.path.join(d, "kernels.json")))
names = {r["kernel"] for r in k["results"]}
for want in ["Memcpy", "Accumulate/fp32", "Accumulate/bf16", "Accumulate/int8",
             "Decode/bf16", "Decode/int8", "Encode/bf16", "Encode/int8",
             "EncodeWithFeedback/int8", "Validate/fp32", "OuterStep"]:
    assert want in names, f"kernels.json lacks {want}"
assert all(r["gb_per_s_median"] > 0 for r in k["results"])
a = json.load(open(os.path.join(d, "aggregator.json")))
run = a["runs"][0]
assert run["workers"] == 2 and run["aggregator"]["round_s_median"] > 0
assert run["aggregator_whole_rounds"]["round_s_median"] > 0, run
assert run["ratios"]["whole_round_over_aggregator_round"] > 0, run
assert run["shards"][0][0]["peak_rss_bytes"] > 0
# CPU per round: the workers' own (getrusage), iperf3's and the Gloo ranks';
# the shards' comes in 10 ms ticks and may round to 0 in so short a run.
cpu = run["cpu_s_per_round"]
assert cpu["workers"]["total"] > 0 and cpu["shards"]["total"] >= 0, cpu
assert cpu["iperf3"]["total"] > 0 and cpu["gloo"]["total"] > 0, cpu
assert run["ratios"]["iperf3_cpu_over_aggregator_cpu"] > 0, run["ratios"]
cp = a["copy_profile"]
assert cp["socket_bytes_received"] >= cp["payload_bytes_received"]
# Contributions are read where gRPC received them: no copy before the
# accumulator (docs/performance.md, "Payload copies").
assert cp["uplink_user_space_copies_per_payload_byte"] < 0.01, cp
# A worker copies a payload byte once going up (the encode) and not at all
# coming down ("Worker copies").
wp = a["client_copy_profile"]
assert wp["uplink_user_space_copies_per_payload_byte"] <= 1.01, wp
assert wp["downlink_user_space_copies_per_payload_byte"] < 0.01, wp
# By size, whatever the labels say: the encode of every delta plus joining
# (a seed's encode and serialisation, or a fetch's parse: at most two copies
# of the anchor). A protobuf copy of the contributions or the updates would
# add the payload once more.
large = wp["memcpy_bytes_total"] - wp["memcpy_bytes_in_small_calls"]
anchor = 4 * cp["params"]
assert large <= wp["payload_bytes_sent"] + 2 * anchor + 65536, wp
b = json.load(open(os.path.join(d, "bytes.json")))
assert len(b["results"]) == 3
for r in b["results"]:
    # The measured co2 bytes are the encoded payload sizes exactly.
    assert abs(r["co2_bytes_per_sample"] - r["co2_bytes_per_sample_model"]) < 1e-6 * r["co2_bytes_per_sample_model"], r
    assert r["reduction"] > 1, r
print("bench smoke: ok")
PY
