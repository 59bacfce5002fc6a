#!/usr/bin/env bash
# fuzz_validate: builds fuzz/validate_fuzzer with clang (libFuzzer + ASan +
# UBSan, every co2 library instrumented) in its own build directory, then
# fuzzes for a bounded time. Any crash, sanitizer report or leak fails.
#   tests/run_fuzz.sh SOURCE_DIR BUILD_DIR [SECONDS]
set -euo pipefail
src=$(cd "$1" && pwd)
build=$2
seconds=${3:-60}
cxx=$(command -v clang++ || command -v clang++-14 || true)
cc=$(command -v clang || command -v clang-14 || true)
if [[ -z "$cxx" ]]; then
  echo "fuzz_validate: clang++ not found (make deps installs clang)" >&2
  exit 1
fi
mkdir -p "$build"
build=$(cd "$build" && pwd)
if [[ ! -f "$build/build.ninja" ]]; then
  CC=$cc CXX=$cxx cmake -S "$src" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCO2_FUZZ=ON -DCO2_WITH_TORCH=OFF \
    -DCO2_BUILD_TESTS=OFF >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j "$(nproc)" --target validate_fuzzer

# Seeds: the mode byte and a knobs byte, then a serialised message (from the
# text protos in fuzz/seeds) or a structured record sequence.
corpus=$(mktemp -d "$build/corpus.XXXXXX")
trap 'rm -rf "$corpus"' EXIT
proto="$src/proto/co2/v1/aggregator.proto"
seed() {  # seed NAME MODE MESSAGE TEXTPB
  { printf "\\x$(printf %02x "$2")\\x00"
    grep -v '^#' "$3" | protoc --proto_path="$src/proto" \
      --encode="co2.v1.$4" "$proto"; } >"$corpus/$1"
}
seed join 0 "$src/fuzz/seeds/join.txtpb" JoinRequest
seed exchange 1 "$src/fuzz/seeds/exchange.txtpb" ExchangeRequest
seed open 1 "$src/fuzz/seeds/open.txtpb" ExchangeRequest
seed anchor 2 "$src/fuzz/seeds/anchor.txtpb" AnchorChunk
# Mode 3: both workers send a full fp32 chunk of 2,000 zeros (weight 1) and
# the round closes: flags (worker | fp32 << 1 | poll), weight, round, chunk,
# length 8000 (0x1f40), payload.
{ printf '\x03\x00'
  for flags in '\x0a' '\x0b'; do
    printf "$flags"'\x00\x00\x80\x3f\x00\x00\x40\x1f'
    head -c 8000 /dev/zero
  done; } >"$corpus/round"
{ printf '\x04\x00'; head -c 4096 /dev/zero; } >"$corpus/codec-fp32"
{ printf '\x04\x02'; head -c 1028 /dev/zero; } >"$corpus/codec-int8"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd "$build"
exec "$build/fuzz/validate_fuzzer" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$build/" \
  "$corpus"
