#!/usr/bin/env bash
# Builds, on this (Debian) machine, what a bare GPU machine cannot build
# itself, into one ignored folder that travels beside the tree
# (docs/gpu-check.md):
#
#   build-gpu-check/bin/co2-aggregator       the shard the Python tests start
#   build-gpu-check/bin/nccl_group_test      tests/nccl_group_test.cc
#   build-gpu-check/python/co2/              the package, its _core built for
#                                            the GPU machine's Python (3.12)
#   build-gpu-check/lib/                     every library those need that is
#                                            not glibc, libstdc++, CUDA or NCCL
#   build-gpu-check/MANIFEST.json            what was built, from which commit
#
# The GPU machine's image has Python, torch, CUDA and NCCL but none of gRPC,
# Protobuf, Abseil or Gloo, so those travel here as shared libraries found
# through RUNPATH ($ORIGIN/../lib). Everything is stripped: the folder stays
# well under the 64 MiB that may be carried (the script prints its size and
# fails above the limit).
#
#   scripts/gpu_check_prepare.sh [OUT_DIR]    default: build-gpu-check
#
# Environment: CO2_GPU_PYTHON, the interpreter whose headers _core is built
# against (default: a CPython 3.12 found on this machine, pyenv's included);
# CO2_GPU_PYTHON_EXTRA, a second interpreter to build _core for as well (so
# that the check can also run here, on this machine's python3 and torch);
# JOBS (default 1); CO2_GPU_CARRY_LIMIT_MIB (default 64).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=${1:-$ROOT/build-gpu-check}
JOBS=${JOBS:-1}
LIMIT_MIB=${CO2_GPU_CARRY_LIMIT_MIB:-64}
BUILD_TESTS_DIR=$ROOT/build-gpu-tests   # co2-aggregator, nccl_group_test
BUILD_PY_DIR=$ROOT/build-gpu-py         # _core for the GPU machine's Python
# ccache hits across clones and build folders (as the Makefile sets them).
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1

find_python312() {
  if [ -n "${CO2_GPU_PYTHON:-}" ]; then
    command -v "$CO2_GPU_PYTHON"; return
  fi
  local c
  for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if command -v "$c" >/dev/null 2>&1 &&
       "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$c"; return
    fi
  done
  return 1
}

PY_GPU=$(find_python312) || {
  echo "gpu_check_prepare: no CPython 3.12 here (set CO2_GPU_PYTHON to the interpreter matching the GPU machine's)" >&2
  exit 1
}
[ -f /usr/local/cuda/include/nccl.h ] || [ -n "${CUDAToolkit_ROOT:-}" ] || {
  echo "gpu_check_prepare: no CUDA toolkit with NCCL under /usr/local/cuda: nccl_group_test would not be built" >&2
  exit 1
}

configure() {  # DIR ARGS...
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    mkdir -p "$dir"
    nice -n 15 cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$dir/configure.log" 2>&1 ||
      { cat "$dir/configure.log" >&2; exit 1; }
  fi
}

echo "gpu_check_prepare: building co2-aggregator and nccl_group_test in $BUILD_TESTS_DIR"
configure "$BUILD_TESTS_DIR" -DCO2_BUILD_BENCH=OFF
grep -q 'NCCL group enabled' "$BUILD_TESTS_DIR/configure.log" 2>/dev/null ||
  grep -q '^CO2_NCCL_LIBRARY:FILEPATH=/' "$BUILD_TESTS_DIR/CMakeCache.txt" ||
  { echo "gpu_check_prepare: CMake did not enable the NCCL group" >&2; exit 1; }
nice -n 15 cmake --build "$BUILD_TESTS_DIR" -j "$JOBS" --target co2-aggregator nccl_group_test

build_python() {  # DIR PYTHON
  local dir=$1 py=$2
  echo "gpu_check_prepare: building the co2 package for $py in $dir"
  configure "$dir" -DPython3_EXECUTABLE="$py" -DCO2_WITH_TORCH=OFF \
    -DCO2_BUILD_TESTS=OFF -DCO2_BUILD_BENCH=OFF
  nice -n 15 cmake --build "$dir" -j "$JOBS" --target co2_python
}
build_python "$BUILD_PY_DIR" "$PY_GPU"
if [ -n "${CO2_GPU_PYTHON_EXTRA:-}" ]; then
  build_python "$BUILD_PY_DIR-extra" "$CO2_GPU_PYTHON_EXTRA"
fi

rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR/bin" "$OUT_DIR/lib" "$OUT_DIR/python/co2"
cp "$BUILD_TESTS_DIR/bin/co2-aggregator" "$BUILD_TESTS_DIR/tests/nccl_group_test" "$OUT_DIR/bin/"
cp "$BUILD_PY_DIR"/python/co2/*.py "$BUILD_PY_DIR"/python/co2/_core*.so "$OUT_DIR/python/co2/"
if [ -n "${CO2_GPU_PYTHON_EXTRA:-}" ]; then
  cp "$BUILD_PY_DIR-extra"/python/co2/_core*.so "$OUT_DIR/python/co2/"
fi

# The libraries to bundle: whatever ldd resolves, less what every Linux with
# a GPU driver has (glibc, the C++ runtime) and what the GPU machine's own
# CUDA and NCCL must provide (their driver-matched copies, not ours).
is_system() {
  case "$1" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libutil.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libnccl.so*|libnvidia*) return 0 ;;
    libpython*) return 0 ;;
  esac
  return 1
}
for obj in "$OUT_DIR"/bin/* "$OUT_DIR"/python/co2/_core*.so; do
  ldd "$obj" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
  while read -r name path; do
    is_system "$name" && continue
    [ -e "$OUT_DIR/lib/$name" ] || cp -L "$path" "$OUT_DIR/lib/$name"
  done
done
strip --strip-unneeded "$OUT_DIR"/bin/* "$OUT_DIR"/python/co2/_core*.so "$OUT_DIR"/lib/*
patchelf --set-rpath '$ORIGIN/../lib' "$OUT_DIR"/bin/*
patchelf --set-rpath '$ORIGIN/../../lib' "$OUT_DIR"/python/co2/_core*.so
patchelf --set-rpath '$ORIGIN' "$OUT_DIR"/lib/*

commit=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
digest=$("$PY_GPU" "$ROOT/scripts/gpu_check_digest.py")
"$PY_GPU" - "$OUT_DIR" "$commit" "$dirty" "$PY_GPU" "$digest" <<'EOF'
import json, os, platform, sys
out, commit, dirty, py, digest = sys.argv[1:6]
files = {}
for d, _, names in os.walk(out):
    for n in names:
        p = os.path.join(d, n)
        files[os.path.relpath(p, out)] = os.path.getsize(p)
json.dump({"commit": commit, "sources_digest": digest, "uncommitted_changes": int(dirty),
           "built_on": platform.platform(), "python_headers": py,
           "python_version": platform.python_version(),
           "total_bytes": sum(files.values()), "files": files},
          open(os.path.join(out, "MANIFEST.json"), "w"), indent=1, sort_keys=True)
EOF

bytes=$(du -sb "$OUT_DIR" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "gpu_check_prepare: $OUT_DIR holds $(find "$OUT_DIR" -type f | wc -l) files, $bytes bytes (~$mib MiB; limit $LIMIT_MIB MiB)"
if [ "$bytes" -gt $(( LIMIT_MIB * 1048576 )) ]; then
  echo "gpu_check_prepare: over the $LIMIT_MIB MiB that may be carried" >&2
  exit 1
fi
