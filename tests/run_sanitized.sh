#!/usr/bin/env bash
# asan_server_tests: configures the `asan` preset (ASan + UBSan, CMakePresets
# .json) without LibTorch in BUILD_DIR, builds the server, common and
# aggregator-client unit and end-to-end tests, and runs them. Any sanitizer
# report fails the test (UB aborts; leaks are reported at exit).
#   tests/run_sanitized.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
build=$2
tests=(layout_test codec_test payload_pieces_test wire_frames_test
       exchange_wire_test worker_wire_test send_buffers_test job_config_test
       outer_optimizer_test round_state_test job_shard_test checkpoint_store_test
       checkpointed_update_test kept_update_test update_cache_test
       chunked_outer_step_test update_replay_test
       shard_metrics_test metrics_server_test shard_ordinal_test
       health_server_test aggregator_errors_test wire_contract_test
       rpc_wire_test seed_state_test aggregator_e2e_test
       fault_shard_restart_test limits_test tls_test read_thread_test)
mkdir -p "$build"
build=$(cd "$build" && pwd)
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$src" --preset asan -B "$build" -DCO2_WITH_TORCH=OFF \
    >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j "$(nproc)" --target "${tests[@]}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
regex="^($(IFS='|'; echo "${tests[*]}"))\$"
cd "$build"
ctest -R "$regex" --output-on-failure --timeout 900 -j "$(nproc)"
