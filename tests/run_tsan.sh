#!/usr/bin/env bash
# tsan_server_tests: the shards' code under ThreadSanitizer. Builds (once,
# cached) the TSan-instrumented Abseil of scripts/tsan_absl.sh, configures
# the `tsan` preset (clang, -fsanitize=thread, without LibTorch) in
# BUILD_DIR against it, builds the server-side unit and end-to-end tests and
# runs them with halt_on_error=1: any TSan report fails the test. Only
# gRPC's and protobuf's own frames are suppressed (tests/tsan.supp).
#   tests/run_tsan.sh SOURCE_DIR BUILD_DIR [TEST ...]
# TEST names a subset of the suites below (default: all of them).
set -euo pipefail
src=$(cd "$1" && pwd)
build=$2
shift 2
# job/: the round, shard and storage units, whose locks the service's
# threads share. service/: the read threads, the lifecycle, the wire. e2e:
# shards and workers over real gRPC (reactors, the poller, read threads,
# checkpoint writers), with restarts, heals and arrivals. Not load_test:
# 64 workers under TSan's slowdown miss its round deadlines.
tests=(round_state_test round_deadline_test round_journal_test
       anchor_exchange_test streamed_round_test shard_members_test
       seed_state_test update_cache_test update_sinks_test kept_update_test
       checkpointed_update_test checkpoint_store_test checkpoint_state_test
       shard_durability_test shard_reporter_test job_lifecycle_test
       job_shard_test shard_metrics_test
       read_thread_test refused_calls_test health_server_test
       job_lifecycle_service_test aggregator_errors_test update_replay_test
       wire_contract_test limits_test
       aggregator_e2e_test heal_e2e_test eager_e2e_test arrival_e2e_test
       reproducible_e2e_test fault_shard_restart_test fault_shard_reseed_test)
if (($#)); then
  tests=("$@")
fi

absl=$("$src/scripts/tsan_absl.sh")
mkdir -p "$build"
build=$(cd "$build" && pwd)
if [[ ! -f "$build/build.ninja" ]]; then
  # The Abseil prefix first: its libraries go into the binaries' DT_RPATH
  # (the preset links with --disable-new-dtags), which the loader also uses
  # for the dependencies of Debian's libgrpc.so, so one Abseil is loaded.
  cmake -S "$src" --preset tsan -B "$build" -DCMAKE_PREFIX_PATH="$absl" \
    >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
fi
jobs=${CO2_TSAN_JOBS:-$(nproc)}
cmake --build "$build" -j "$jobs" --target "${tests[@]}"

# Every Abseil library a test loads must be the instrumented one: an
# uninstrumented absl::Mutex would hide the locks TSan has to see.
probe=$build/tests/${tests[0]}
if ldd "$probe" | grep 'libabsl_' | grep -v -q "$absl/lib/"; then
  echo "run_tsan.sh: $probe loads an Abseil outside $absl:" >&2
  ldd "$probe" | grep 'libabsl_' | grep -v "$absl/lib/" >&2
  exit 1
fi

export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 suppressions=$src/tests/tsan.supp ${TSAN_OPTIONS:-}"
regex="^($(IFS='|'; echo "${tests[*]}"))\$"
cd "$build"
ctest -R "$regex" --output-on-failure --timeout 2400 -j "$jobs"
