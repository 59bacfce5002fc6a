#!/usr/bin/env bash
# The ThreadSanitizer-instrumented Abseil that the TSan run
# (tests/run_tsan.sh) links co2 and, at run time, Debian's gRPC against.
#
#   scripts/tsan_absl.sh    prints the install prefix, building it once
#
# It is Debian's own source package of the Abseil that libgrpc++1.51 is
# built against (abseil 20220623.1-1+deb12u2: upstream 20220623.1 with
# Debian's patches, inline namespace `debian3`, SONAME 20220623), fetched
# from deb.debian.org's pool and checked against the SHA-256 sums below,
# unpacked with dpkg-source and built with clang -fsanitize=thread as
# debian/rules builds the shared libraries (CMAKE_CXX_STANDARD=17,
# BUILD_SHARED_LIBS=ON, dpkg-buildflags' -g -O2 without NDEBUG). Same
# version, patches and options, so the libraries are ABI-compatible with
# Debian's: with them first on the library path, Debian's libgrpc.so uses
# them too, and TSan sees every absl::Mutex.
#
# The prefix lives outside the clone, in $CO2_CACHE_DIR (default
# ~/.cache/co2)/absl-tsan-<version>, and is reused once complete. Where
# deb.debian.org cannot be reached and nothing is cached, it exits 77
# (ctest's skip) with the reason. A build takes ~15 min on 2 cores.
set -euo pipefail

VERSION=20220623.1-1+deb12u2
UPSTREAM=20220623.1
POOL=${CO2_DEBIAN_POOL:-http://deb.debian.org/debian/pool/main/a/abseil}
# name sha256 (from the Sources index of bookworm, signed by Debian).
FILES=(
  "abseil_$VERSION.dsc ba731eaced569332fa4ce802a7ff2615ae57ac25beaf2d02f634ef908f2e62c2"
  "abseil_$UPSTREAM.orig.tar.gz abfe2897f3a30edaa74bc34365afe3c2a3cd012091a97dc7e008f7016adcd5fe"
  "abseil_$VERSION.debian.tar.xz e08490fc7b6f3beca1925953b0c4fb92df2de5e2a01295e4641e2a3d4e528eeb"
)
CACHE=${CO2_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/co2}
PREFIX=$CACHE/absl-tsan-$VERSION
CXX=${CO2_TSAN_CXX:-clang++}
CC=${CO2_TSAN_CC:-clang}

if [[ -f "$PREFIX/.complete" ]]; then
  echo "$PREFIX"
  exit 0
fi

mkdir -p "$CACHE"
# One builder at a time; a second caller waits and reuses its result.
exec 9>"$CACHE/.absl-tsan.lock"
flock -w 3600 9 || { echo "$0: $CACHE/.absl-tsan.lock held for 1 h" >&2; exit 1; }
if [[ -f "$PREFIX/.complete" ]]; then
  echo "$PREFIX"
  exit 0
fi

installed=$(dpkg-query -W -f='${Version}' libabsl20220623 2>/dev/null || true)
if [[ -n "$installed" && "$installed" != "$VERSION" ]]; then
  echo "$0: note: libabsl20220623 $installed is installed, building $VERSION" \
       "(same upstream version and SONAME)" >&2
fi
for tool in dpkg-source cmake ninja "$CXX"; do
  command -v "$tool" >/dev/null || { echo "$0: $tool not found" >&2; exit 1; }
done

work=$PREFIX.partial
rm -rf "$work" "$PREFIX"
mkdir -p "$work/download"
for entry in "${FILES[@]}"; do
  read -r name sum <<<"$entry"
  if ! curl -fsS --retry 3 --max-time 300 -o "$work/download/$name" \
       "$POOL/$name" 2>"$work/curl.err"; then
    echo "SKIP: $POOL/$name cannot be fetched and $PREFIX is not built:" \
         "$(cat "$work/curl.err")" >&2
    rm -rf "$work"
    exit 77
  fi
  echo "$sum  $work/download/$name" | sha256sum -c --quiet - || {
    echo "$0: $name does not have the pinned SHA-256 $sum" >&2; exit 1; }
done
# Applies debian/patches (quilt 3.0): options.h's inline namespace debian3,
# the SONAME, the CPU feature set and the CVE fix, as Debian's package has.
dpkg-source --no-check -x "$work/download/abseil_$VERSION.dsc" "$work/src" \
  >"$work/dpkg-source.log"
grep -q '^#define ABSL_OPTION_INLINE_NAMESPACE_NAME debian3' \
  "$work/src/absl/base/options.h" || {
  echo "$0: Debian's patches did not apply (no inline namespace debian3)" >&2
  exit 1; }

flags="-g -O2 -fsanitize=thread -fno-omit-frame-pointer"
cmake -S "$work/src" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON \
  -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
  -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib \
  -DCMAKE_INSTALL_RPATH="$PREFIX/lib" \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log" >&2; exit 1; }
jobs=${CO2_TSAN_JOBS:-$(nproc)}
cmake --build "$work/build" -j "$jobs" >"$work/build.log" 2>&1 || {
  tail -50 "$work/build.log" >&2; exit 1; }
cmake --install "$work/build" >"$work/install.log" 2>&1 || {
  cat "$work/install.log" >&2; exit 1; }
# The libraries must be the ones Debian's gRPC asks for, by SONAME.
for lib in synchronization base status strings; do
  [[ -e "$PREFIX/lib/libabsl_$lib.so.20220623" ]] || {
    echo "$0: $PREFIX/lib/libabsl_$lib.so.20220623 was not installed" >&2
    exit 1; }
done
echo "$VERSION" >"$PREFIX/.complete"
rm -rf "$work"
echo "$PREFIX"
