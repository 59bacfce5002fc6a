#!/usr/bin/env bash
# install_example_test BUILD_DIR SOURCE_DIR: `cmake --install` of the build
# tree into a temporary prefix; examples/minimal_trainer configured and built
# out of tree against it (find_package(co2 CONFIG REQUIRED), co2::client);
# then a co2-aggregator from the prefix on a free port and the example trained
# against it for a few rounds: it must exit 0 and print its losses.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
rounds=${3:-4}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/co2-install-test.XXXXXX")
agg_pid=
cleanup() {
  if [ -n "$agg_pid" ]; then kill "$agg_pid" 2>/dev/null || true; wait "$agg_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "install_example_test: FAIL: $*" >&2; exit 1; }

echo "== cmake --install $build --prefix $tmp/prefix"
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
for f in lib/cmake/co2/co2Config.cmake lib/cmake/co2/co2Targets.cmake \
         include/co2/client/training/co2_optimizer.h include/co2/v1/aggregator.pb.h \
         bin/co2-aggregator; do
  [ -e "$tmp/prefix/$f" ] || fail "the install lacks $f"
done
for d in client common server; do
  [ ! -e "$tmp/prefix/include/$d" ] || fail "headers installed outside include/co2: include/$d"
done

if [ -x /usr/bin/python3 ] && [ -e "$build/python/co2/__init__.py" ]; then
  echo "== import co2 from the prefix's dist-packages"
  site=$(find "$tmp/prefix" -name '_core*.so' -path "*/co2/*" -printf '%h\n' | head -1)
  [ -n "$site" ] || fail "the install lacks the Python package co2"
  PYTHONPATH=$(dirname "$site") /usr/bin/python3 -c \
    "import co2; assert co2.__file__.startswith('$tmp'), co2.__file__; print(co2.JobConfig())" \
    || fail "import co2 from $site"
fi

echo "== configure and build examples/minimal_trainer against the prefix"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
launcher=()
if command -v ccache >/dev/null; then
  # Paths under $tmp hash the same in every run, so the one torch TU is
  # compiled once per machine.
  export CCACHE_BASEDIR="$tmp" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$src/examples/minimal_trainer" -B "$tmp/build" "${generator[@]}" \
  "${launcher[@]}" -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/configure.log" 2>&1 \
  || { cat "$tmp/configure.log"; fail "configuring the example"; }
cmake --build "$tmp/build" >"$tmp/build.log" 2>&1 \
  || { tail -50 "$tmp/build.log"; fail "building the example"; }

echo "== co2-aggregator --insecure --port=0"
"$tmp/prefix/bin/co2-aggregator" --insecure --host=127.0.0.1 --port=0 \
  --metrics_port=-1 >"$tmp/aggregator.log" 2>&1 &
agg_pid=$!
port=
for _ in $(seq 1 300); do
  port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$tmp/aggregator.log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$agg_pid" 2>/dev/null || { cat "$tmp/aggregator.log"; fail "co2-aggregator exited"; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$tmp/aggregator.log"; fail "co2-aggregator did not report its port"; }

echo "== minimal_trainer 127.0.0.1:$port worker-0 $rounds"
status=0
timeout 300 "$tmp/build/minimal_trainer" "127.0.0.1:$port" worker-0 "$rounds" \
  >"$tmp/trainer.out" 2>&1 || status=$?
cat "$tmp/trainer.out"
[ "$status" = 0 ] || { tail -20 "$tmp/aggregator.log"; fail "minimal_trainer exited with $status"; }
losses=$(grep -c '^round [0-9]* loss [0-9.]*$' "$tmp/trainer.out" || true)
[ "$losses" = "$rounds" ] || fail "expected $rounds loss lines, got $losses"
grep -q '^done: ' "$tmp/trainer.out" || fail "no final line"
# Co2OptimizerOptions left unset runs what co2-train and co2.Optimizer run by
# default (docs/defaults.md).
grep -qx 'co2: apply arrival, carry_progress true' "$tmp/trainer.out" \
  || fail "the example's default Co2OptimizerOptions did not pick apply arrival with carried progress"
echo "install_example_test: PASS"
