// The streaming kernels of the aggregator and the client, in GB/s next to a
// memcpy of the same size in the same run (docs/performance.md §3). GB/s
// counts every byte a kernel reads and writes once: for acc += w·decode(p)
// that is the payload read plus the accumulator read and written. Two sizes
// per kernel, given as the fp32 range n: 1 MiB (four wire chunks, in cache) and
// 64 MiB (out of cache). bench/run_kernels.sh turns the JSON into
// bench/results/kernels.json with the ratios to memcpy.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/codec.h"
#include "common/payload_pieces.h"
#include "server/job/exact_sum.h"
#include "server/job/outer_optimizer.h"

namespace {

using co2::common::Codec;

// Sizes of the fp32 range, in bytes.
constexpr int64_t kInCache = int64_t{1} << 20;
constexpr int64_t kOutOfCache = int64_t{64} << 20;

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::string EncodedRandom(Codec codec, size_t n, uint32_t seed) {
  const std::vector<float> v = RandomFloats(n, seed);
  std::string bytes(co2::common::EncodedSize(codec, n), '\0');
  co2::common::Encode(codec, v, absl::MakeSpan(bytes.data(), bytes.size()));
  return bytes;
}

size_t Elements(const benchmark::State& state) {
  return static_cast<size_t>(state.range(0)) / sizeof(float);
}

void SetBytes(benchmark::State& state, size_t bytes_per_iteration) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(bytes_per_iteration));
  state.counters["bytes_per_iteration"] =
      static_cast<double>(bytes_per_iteration);
}

// The reference: copy n fp32 (read n·4, write n·4).
void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  SetBytes(state, 2 * bytes);
}

// What a shard does per received chunk: acc += w · decode(payload).
void BM_Accumulate(benchmark::State& state, Codec codec) {
  const size_t n = Elements(state);
  const std::string payload = EncodedRandom(codec, n, 1);
  std::vector<float> acc(n, 0.0f);
  for (auto _ : state) {
    co2::common::AccumulateDecoded(codec, payload, 0.5f, absl::MakeSpan(acc));
    benchmark::ClobberMemory();
  }
  SetBytes(state, payload.size() + 2 * n * sizeof(float));
}

// What a shard does per received chunk: sum += w · decode(payload), exactly
// (server/job/exact_sum.h). Bytes: the payload read plus every element's
// 8-byte sum read and written.
void BM_ExactAccumulate(benchmark::State& state, Codec codec) {
  const size_t n = Elements(state);
  const std::string payload = EncodedRandom(codec, n, 1);
  const std::string_view piece(payload);
  // A first term stores the sums (and touches their pages): outside the
  // timing, as a shard reuses its accumulators from round to round.
  co2::server::ExactSum sum(n);
  const co2::common::Pieces pieces(&piece, 1);
  if (!sum.Add(codec, pieces, 0.5f).ok()) state.SkipWithError("not finite");
  constexpr uint32_t kTermsPerRound = 4096;
  uint32_t terms = 1;
  for (auto _ : state) {
    if (++terms == kTermsPerRound) {  // a fresh round
      state.PauseTiming();
      sum.Clear();
      benchmark::DoNotOptimize(sum.Add(codec, pieces, 0.5f).ok());
      terms = 2;
      state.ResumeTiming();
    }
    benchmark::DoNotOptimize(sum.Add(codec, pieces, 0.5f).ok());
    benchmark::ClobberMemory();
  }
  SetBytes(state, payload.size() + 2 * n * sizeof(double));
}

// The shard's check before it accumulates a chunk: would acc + w · decode(p)
// overflow anywhere? Reads what the accumulate reads, writes nothing.
void BM_OverflowCheck(benchmark::State& state, Codec codec) {
  const size_t n = Elements(state);
  const std::string payload = EncodedRandom(codec, n, 1);
  const std::vector<float> acc = RandomFloats(n, 5);
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        co2::common::FirstNonFiniteSum(codec, payload, 0.5f, acc));
  }
  SetBytes(state, payload.size() + n * sizeof(float));
}

void BM_Decode(benchmark::State& state, Codec codec) {
  const size_t n = Elements(state);
  const std::string payload = EncodedRandom(codec, n, 2);
  std::vector<float> out(n);
  for (auto _ : state) {
    co2::common::Decode(codec, payload, absl::MakeSpan(out));
    benchmark::ClobberMemory();
  }
  SetBytes(state, payload.size() + n * sizeof(float));
}

void BM_Encode(benchmark::State& state, Codec codec) {
  const size_t n = Elements(state);
  const std::vector<float> in = RandomFloats(n, 3);
  std::string out(co2::common::EncodedSize(codec, n), '\0');
  for (auto _ : state) {
    co2::common::Encode(codec, in, absl::MakeSpan(out.data(), out.size()));
    benchmark::ClobberMemory();
  }
  SetBytes(state, n * sizeof(float) + out.size());
}

// The client's uplink: v = value + residual, encode v, residual = v − dec(v).
// The residual stays small (it is a quantisation error), as in training.
void BM_EncodeWithFeedback(benchmark::State& state, Codec codec) {
  const size_t n = Elements(state);
  const std::vector<float> value = RandomFloats(n, 4);
  std::vector<float> residual = RandomFloats(n, 5, 1e-3f);
  std::string out(co2::common::EncodedSize(codec, n), '\0');
  for (auto _ : state) {
    co2::common::EncodeWithFeedback(codec, value, absl::MakeSpan(residual),
                                    absl::MakeSpan(out.data(), out.size()));
    benchmark::ClobberMemory();
  }
  SetBytes(state, 3 * n * sizeof(float) + out.size());
}

// The NaN/Inf scan every received chunk goes through.
void BM_Validate(benchmark::State& state, Codec codec) {
  const size_t n = Elements(state);
  const std::string payload = EncodedRandom(codec, n, 6);
  for (auto _ : state) {
    absl::Status s = co2::common::Validate(codec, payload, n);
    if (!s.ok()) state.SkipWithError(std::string(s.message()).c_str());
    benchmark::DoNotOptimize(s);
  }
  SetBytes(state, payload.size());
}

// The outer step's settings in both benchmarks: gap-aware penalty, adaptive
// clipping k = 3, heavy ball β = 0.5, α = 1.
co2::server::OuterConfig StepConfig() {
  co2::server::OuterConfig config;
  config.alpha = 1.0f;
  config.beta = 0.5f;
  config.momentum = co2::server::MomentumKind::kHeavyBall;
  config.penalty = co2::server::GapPenalty::kGapAware;
  config.clip = co2::server::ClipMode::kAdaptive;
  config.clip_value = 3.0f;
  return config;
}

// The outer step (StepConfig), update written over the gap as a shard does:
// reads mean Δ, gap and m, writes m and U (5 · n · 4 bytes).
void BM_OuterStep(benchmark::State& state) {
  const size_t n = Elements(state);
  const co2::server::OuterConfig config = StepConfig();
  const std::vector<float> delta = RandomFloats(n, 7);
  std::vector<float> momentum = RandomFloats(n, 8);
  std::vector<float> update = RandomFloats(n, 9);
  for (auto _ : state) {
    co2::server::OuterStepStats stats = co2::server::OuterStep(
        config, 0, delta, update, absl::MakeSpan(momentum),
        absl::MakeSpan(update));
    benchmark::DoNotOptimize(stats);
    benchmark::ClobberMemory();
  }
  SetBytes(state, 5 * n * sizeof(float));
}

// The check before each chunk's step that it cannot make m, U or A
// non-finite (CheckStepFits): a max-|x| pass over each of mean Δ, m and A
// (3 · n · 4 bytes read), at StepConfig.
void BM_CheckStepFits(benchmark::State& state) {
  const size_t n = Elements(state);
  const co2::server::OuterConfig config = StepConfig();
  const std::vector<float> delta = RandomFloats(n, 7);
  const std::vector<float> momentum = RandomFloats(n, 8);
  const std::vector<float> anchor = RandomFloats(n, 10);
  for (auto _ : state) {
    absl::Status fits =
        co2::server::CheckStepFits(config, delta, momentum, anchor);
    if (!fits.ok()) state.SkipWithError(std::string(fits.message()).c_str());
    benchmark::DoNotOptimize(fits);
  }
  SetBytes(state, 3 * n * sizeof(float));
}

void Sizes(benchmark::internal::Benchmark* b) {
  b->Arg(kInCache)->Arg(kOutOfCache);
}

BENCHMARK(BM_Memcpy)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Accumulate, fp32, Codec::kFp32)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Accumulate, bf16, Codec::kBf16)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Accumulate, int8, Codec::kInt8)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_ExactAccumulate, fp32, Codec::kFp32)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_ExactAccumulate, bf16, Codec::kBf16)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_ExactAccumulate, int8, Codec::kInt8)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_OverflowCheck, fp32, Codec::kFp32)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_OverflowCheck, bf16, Codec::kBf16)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_OverflowCheck, int8, Codec::kInt8)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Decode, bf16, Codec::kBf16)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Decode, int8, Codec::kInt8)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Encode, bf16, Codec::kBf16)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Encode, int8, Codec::kInt8)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_EncodeWithFeedback, fp32, Codec::kFp32)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_EncodeWithFeedback, bf16, Codec::kBf16)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_EncodeWithFeedback, int8, Codec::kInt8)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Validate, fp32, Codec::kFp32)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Validate, bf16, Codec::kBf16)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Validate, int8, Codec::kInt8)->Apply(Sizes);
BENCHMARK(BM_OuterStep)->Apply(Sizes);
BENCHMARK(BM_CheckStepFits)->Apply(Sizes);

}  // namespace

BENCHMARK_MAIN();
