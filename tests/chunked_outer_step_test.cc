#include "server/job/chunked_outer_step.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/codec.h"
#include "common/fnv_hash.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "server/job/update_messages.h"
#include "tests/status_matchers.h"
#include "tests/stored_chunks.h"

namespace co2::server {
namespace {

TEST(OuterConfigOfTest, TranslatesEveryField) {
  v1::JobConfig c = common::DefaultJobConfig(10, 1);
  c.set_alpha(0.7f);
  c.set_beta(0.5f);
  c.set_momentum(v1::MOMENTUM_NESTEROV);
  c.set_gap_penalty(v1::GAP_PENALTY_CONSTANT);
  c.set_penalty_lambda(2.5f);
  c.set_clip(v1::CLIP_VALUE);
  c.set_clip_value(4.0f);
  OuterConfig o = OuterConfigOf(c);
  EXPECT_EQ(o.alpha, 0.7f);
  EXPECT_EQ(o.beta, 0.5f);
  EXPECT_EQ(o.momentum, MomentumKind::kNesterov);
  EXPECT_EQ(o.penalty, GapPenalty::kConstant);
  EXPECT_EQ(o.penalty_lambda, 2.5f);
  EXPECT_EQ(o.clip, ClipMode::kValue);
  EXPECT_EQ(o.clip_value, 4.0f);
  c.set_momentum(v1::MOMENTUM_HEAVY_BALL);
  c.set_gap_penalty(v1::GAP_PENALTY_GAP_AWARE);
  c.set_clip(v1::CLIP_ADAPTIVE);
  o = OuterConfigOf(c);
  EXPECT_EQ(o.momentum, MomentumKind::kHeavyBall);
  EXPECT_EQ(o.penalty, GapPenalty::kGapAware);
  EXPECT_EQ(o.clip, ClipMode::kAdaptive);
  c.set_gap_penalty(v1::GAP_PENALTY_NONE);
  c.set_clip(v1::CLIP_NONE);
  o = OuterConfigOf(c);
  EXPECT_EQ(o.penalty, GapPenalty::kNone);
  EXPECT_EQ(o.clip, ClipMode::kNone);
  c.set_momentum(v1::MOMENTUM_DELAYED_NESTEROV);
  c.set_momentum_period(3);
  o = OuterConfigOf(c);
  EXPECT_EQ(o.momentum, MomentumKind::kDelayedNesterov);
  EXPECT_EQ(o.momentum_period, 3u);
}

// Adaptive clipping on, staleness 2, the gap-aware penalty unless told.
v1::JobConfig StepConfig(size_t n, float beta, v1::Codec downlink,
                         v1::Momentum momentum = v1::MOMENTUM_HEAVY_BALL,
                         v1::GapPenalty penalty = v1::GAP_PENALTY_GAP_AWARE) {
  v1::JobConfig c = common::DefaultJobConfig(n, 1);
  c.set_alpha(0.7f);
  c.set_beta(beta);
  c.set_momentum(momentum);
  if (momentum == v1::MOMENTUM_DELAYED_NESTEROV) c.set_momentum_period(2);
  c.set_max_staleness(2);
  c.set_gap_penalty(penalty);
  c.set_clip(v1::CLIP_ADAPTIVE);
  c.set_clip_value(2.0f);
  c.set_downlink_codec(downlink);
  return c;
}

TEST(UpdateMessagesTest, MessagesNameTheRoundTheyMakeAndTheChunk) {
  const size_t n = common::kChunkElements + 10;
  const v1::JobConfig config = StepConfig(n, 0, v1::CODEC_BF16);
  ShardStepConfig step(config, n);
  EXPECT_EQ(step.num_chunks(), 2u);
  EXPECT_EQ(step.elements(), n);
  const UpdateMessages messages(config, step.num_chunks());
  auto m = messages.Make(7, 1, 3, "bytes", 42);
  EXPECT_EQ(m->round(), 7u);
  EXPECT_EQ(m->anchor_round(), 7u + 1 + 2);  // U_r makes A_{r+1+s}
  EXPECT_EQ(m->chunk_index(), 1u);
  EXPECT_EQ(m->num_chunks(), 2u);
  EXPECT_EQ(m->codec(), v1::CODEC_BF16);
  EXPECT_EQ(m->contributors(), 3u);
  EXPECT_EQ(m->payload(), "bytes");
  EXPECT_EQ(m->anchor_digest(), 42u);
}

// `flat` cut into its chunks, as a closed round hands its mean over.
std::vector<std::vector<float>> InChunks(const std::vector<float>& flat) {
  std::vector<std::vector<float>> chunks;
  for (uint32_t c = 0; c < common::NumChunks(flat.size()); ++c) {
    const common::Range r = common::ChunkRange(flat.size(), c);
    chunks.emplace_back(flat.begin() + r.begin, flat.begin() + r.end);
  }
  return chunks;
}

// The payloads of `chunks`, kept in a file as a checkpoint keeps them.
std::shared_ptr<const CheckpointedUpdate> Stored(const UpdateChunks& chunks) {
  std::vector<std::string> payloads;
  for (const auto& chunk : chunks) payloads.push_back(chunk->payload());
  return StoreChunks(payloads);
}

// What RunRound made: the step's result and the update's messages.
struct RoundRun : StepResult {
  std::shared_ptr<const UpdateChunks> update;
};

// The step of a whole closed round, as a shard that streams nothing runs it
// at the close, and its update as `messages` makes it.
RoundRun RunRound(const ShardStepConfig& step, const UpdateMessages& messages,
                  ClosedRound& closed, const KeptUpdate* last,
                  const OuterStepBuffers& buffers) {
  RoundStep round(step, closed.round,
                  last == nullptr ? std::nullopt : std::optional(*last),
                  buffers);
  auto update = std::make_shared<UpdateChunks>();
  for (ChunkUpdate& chunk : round.StepRest(closed)) {
    EXPECT_EQ(chunk.chunk_index, update->size());
    update->push_back(messages.Make(closed.round, chunk.chunk_index,
                                    closed.contributors,
                                    std::move(chunk.payload),
                                    chunk.anchor_digest));
  }
  RoundRun run{std::move(round).Finish(), std::move(update)};
  return run;
}

// Chunk by chunk, with m kept only for β != 0 and the gap decoded from the
// last update's payload (in memory, or read back from its checkpoint), the
// step must be bit for bit the step on the whole range (whose gap is the last
// update as the workers decoded it) followed by what the workers decode.
// Parameters: β, codec, momentum, penalty, last update stored.
class ShardStepConfigRunTest
    : public ::testing::TestWithParam<
          std::tuple<float, v1::Codec, v1::Momentum, v1::GapPenalty, bool>> {};

TEST_P(ShardStepConfigRunTest, IsTheStepOnTheWholeRange) {
  const auto [beta, downlink, kind, penalty, stored] = GetParam();
  const size_t n = 2 * common::kChunkElements + 1000;  // 3 chunks, 1 short
  const v1::JobConfig config = StepConfig(n, beta, downlink, kind, penalty);
  const common::Codec codec = common::Codec(downlink);
  const ShardStepConfig step(config, n);
  const UpdateMessages messages(config, step.num_chunks());
  std::vector<float> anchor(n, 1.0f), momentum(beta != 0 ? n : 0);
  // The reference state.
  std::vector<float> ref_anchor(n, 1.0f), ref_m(n, 0.0f), gap(n, 0.0f),
      update(n);
  std::optional<KeptUpdate> last;
  for (uint64_t r = 0; r < 3; ++r) {
    ClosedRound closed;
    closed.round = r;
    closed.contributors = 2;
    std::vector<float> mean(n);
    for (size_t i = 0; i < n; ++i) {
      mean[i] =
          std::sin(0.001f * static_cast<float>(i) + static_cast<float>(r)) *
          static_cast<float>(1 + i % 5);
    }
    closed.mean = InChunks(mean);
    const RoundRun result = RunRound(
        step, messages, closed, last.has_value() ? &*last : nullptr,
        OuterStepBuffers{absl::MakeSpan(anchor), absl::MakeSpan(momentum)});
    CO2_EXPECT_OK(result.gap_error);
    EXPECT_EQ(result.unread_gap_chunks, 0u);
    const OuterStepStats& stats = result.stats;
    const UpdateChunks& chunks = *result.update;
    for (const std::vector<float>& chunk : closed.mean) {
      EXPECT_TRUE(chunk.empty()) << "the mean's chunks are freed as they go";
    }
    OuterStepStats ref_stats =
        OuterStep(OuterConfigOf(config), r, mean, gap, absl::MakeSpan(ref_m),
                  absl::MakeSpan(update));
    EXPECT_EQ(stats.clipped, ref_stats.clipped);
    EXPECT_NEAR(stats.momentum_norm_sq, ref_stats.momentum_norm_sq,
                1e-9 * ref_stats.momentum_norm_sq);
    EXPECT_NEAR(stats.mean_penalty, ref_stats.mean_penalty, 1e-9);
    ASSERT_EQ(chunks.size(), 3u);
    for (uint32_t c = 0; c < 3; ++c) {
      const common::Range range = common::ChunkRange(n, c);
      std::string bytes(common::EncodedSize(codec, range.size()), '\0');
      common::Encode(codec,
                     absl::MakeConstSpan(update).subspan(range.begin,
                                                         range.size()),
                     absl::MakeSpan(bytes.data(), bytes.size()));
      EXPECT_EQ(chunks[c]->payload(), bytes) << "round " << r << " chunk " << c;
      EXPECT_EQ(chunks[c]->round(), r);
      EXPECT_EQ(chunks[c]->chunk_index(), c);
      common::Decode(codec, bytes,
                     absl::MakeSpan(gap).subspan(range.begin, range.size()));
    }
    for (size_t i = 0; i < n; ++i) ref_anchor[i] += gap[i];
    ASSERT_EQ(std::memcmp(anchor.data(), ref_anchor.data(), n * sizeof(float)),
              0)
        << "round " << r;
    for (uint32_t c = 0; c < 3; ++c) {
      const common::Range range = common::ChunkRange(n, c);
      EXPECT_EQ(chunks[c]->anchor_digest(),
                common::AnchorDigest(absl::MakeConstSpan(anchor).subspan(
                    range.begin, range.size())))
          << "round " << r << " chunk " << c;
    }
    if (beta == 0) std::fill(ref_m.begin(), ref_m.end(), 0.0f);
    last.emplace(result.update);
    if (stored) last->Store(Stored(chunks));
  }
}

INSTANTIATE_TEST_SUITE_P(
    BetaDownlinkMomentumAndPenalty, ShardStepConfigRunTest,
    ::testing::Combine(
        ::testing::Values(0.0f, 0.9f),
        ::testing::Values(v1::CODEC_FP32, v1::CODEC_BF16, v1::CODEC_INT8),
        ::testing::Values(v1::MOMENTUM_HEAVY_BALL, v1::MOMENTUM_NESTEROV,
                          v1::MOMENTUM_DELAYED_NESTEROV),
        ::testing::Values(v1::GAP_PENALTY_GAP_AWARE, v1::GAP_PENALTY_NONE),
        ::testing::Bool()));

// A gap chunk that cannot be read back from its checkpoint (here the file was
// truncated under the shard) is taken as zero; the step still runs whole, as
// the step with that chunk of the last update all zeros, and says why.
TEST(ShardStepConfigTest, AGapChunkThatCannotBeReadBackIsZero) {
  const size_t n = 2 * common::kChunkElements + 1000;
  const v1::JobConfig config = StepConfig(n, 0.9f, v1::CODEC_FP32);
  const ShardStepConfig step(config, n);
  const UpdateMessages messages(config, step.num_chunks());
  ClosedRound closed;
  closed.contributors = 2;
  std::vector<float> mean(n);
  for (size_t i = 0; i < n; ++i) mean[i] = std::cos(0.01f * i);
  closed.mean = InChunks(mean);
  std::vector<float> anchor(n, 1.0f), momentum(n, 0.0f);
  const RoundRun first =
      RunRound(step, messages, closed, nullptr,
               {absl::MakeSpan(anchor), absl::MakeSpan(momentum)});

  // The reference: the same last update with chunk 2 zeroed, in memory.
  auto zeroed = std::make_shared<UpdateChunks>(*first.update);
  (*zeroed)[2] = messages.Make(
      0, 2, 2, std::string((*zeroed)[2]->payload().size(), '\0'), 0);
  std::vector<float> ref_anchor = anchor, ref_momentum = momentum;
  const KeptUpdate ref_last(zeroed);
  closed.round = 1;
  closed.mean = InChunks(mean);
  const RoundRun ref =
      RunRound(step, messages, closed, &ref_last,
               {absl::MakeSpan(ref_anchor), absl::MakeSpan(ref_momentum)});

  std::vector<std::string> payloads;
  for (const auto& chunk : *first.update) payloads.push_back(chunk->payload());
  std::string path;
  KeptUpdate last(first.update);
  last.Store(StoreChunks(payloads, &path, /*keep_file=*/true));
  const size_t chunk2 =
      sizeof(kStoredPrefix) - 1 + payloads[0].size() + payloads[1].size();
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(chunk2 + 100)), 0);
  closed.mean = InChunks(mean);
  const RoundRun result =
      RunRound(step, messages, closed, &last,
               {absl::MakeSpan(anchor), absl::MakeSpan(momentum)});
  EXPECT_EQ(result.unread_gap_chunks, 1u);
  EXPECT_EQ(result.gap_error.code(), absl::StatusCode::kDataLoss)
      << result.gap_error;
  EXPECT_NE(result.gap_error.message().find(path), std::string::npos)
      << result.gap_error;
  EXPECT_EQ(anchor, ref_anchor);
  EXPECT_EQ(momentum, ref_momentum);
  for (uint32_t c = 0; c < 3; ++c) {
    EXPECT_EQ((*result.update)[c]->payload(), (*ref.update)[c]->payload())
        << "chunk " << c;
  }
  ::unlink(path.c_str());
}

// Every value of `x` is finite.
bool AllFinite(absl::Span<const float> x) {
  for (const float v : x) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// A chunk whose mean would make the anchor (chunk 1) or the momentum
// (chunk 2) non-finite is refused: its A and m stay, its update decodes to
// zeros, and the digest is of the unchanged anchor; chunk 0 steps as usual.
// Then rounds of the largest finite mean: nothing non-finite is ever
// published or kept. Parameters: downlink codec, momentum.
class RefusedStepTest
    : public ::testing::TestWithParam<std::tuple<v1::Codec, v1::Momentum>> {};

TEST_P(RefusedStepTest, NothingNonFiniteIsEverPublished) {
  const auto [downlink, kind] = GetParam();
  const size_t n = 2 * common::kChunkElements + 1000;
  const v1::JobConfig config =
      StepConfig(n, 0.9f, downlink, kind, v1::GAP_PENALTY_NONE);
  const common::Codec codec = common::Codec(downlink);
  const ShardStepConfig step(config, n);
  const UpdateMessages messages(config, step.num_chunks());
  const common::Range c1 = common::ChunkRange(n, 1), c2 = common::ChunkRange(n, 2);
  std::vector<float> anchor(n, 1.0f), momentum(n, 0.0f), mean(n, 1.0f);
  for (size_t i = c1.begin; i < c1.end; ++i) anchor[i] = 3e38f;
  for (size_t i = c1.begin; i < c1.end; ++i) mean[i] = 1e38f;
  for (size_t i = c2.begin; i < c2.end; ++i) momentum[i] = 3e38f;
  for (size_t i = c2.begin; i < c2.end; ++i) mean[i] = 3e38f;
  const std::vector<float> anchor_before = anchor, momentum_before = momentum;
  ClosedRound closed;
  closed.contributors = 2;
  closed.mean = InChunks(mean);
  const RoundRun first =
      RunRound(step, messages, closed, nullptr,
               {absl::MakeSpan(anchor), absl::MakeSpan(momentum)});
  EXPECT_EQ(first.stats.refused_chunks, 2u);
  EXPECT_EQ(first.refused_error.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(first.refused_error.message().find("chunk 1: the step would make "
                                               "the anchor non-finite"),
            std::string::npos)
      << first.refused_error;
  const auto span = [](const std::vector<float>& v, common::Range r) {
    return std::vector<float>(v.begin() + r.begin, v.begin() + r.end);
  };
  for (const common::Range r : {c1, c2}) {
    EXPECT_EQ(span(anchor, r), span(anchor_before, r));
    EXPECT_EQ(span(momentum, r), span(momentum_before, r));
  }
  EXPECT_NE(anchor[0], 1.0f) << "chunk 0 steps";
  for (uint32_t c = 1; c < 3; ++c) {
    const common::Range r = common::ChunkRange(n, c);
    std::vector<float> decoded(r.size(), 1.0f);
    common::Decode(codec, (*first.update)[c]->payload(),
                   absl::MakeSpan(decoded));
    EXPECT_EQ(decoded, std::vector<float>(r.size(), 0.0f)) << "chunk " << c;
    EXPECT_EQ((*first.update)[c]->anchor_digest(),
              common::AnchorDigest(absl::MakeConstSpan(anchor).subspan(
                  r.begin, r.size())));
  }

  // Means of 1e37 · 3^r, alternating in sign, then the largest finite
  // value: the first steps fit, later ones are refused.
  std::optional<KeptUpdate> last(KeptUpdate(first.update));
  uint32_t refused = 0;
  for (uint64_t r = 1; r < 6; ++r) {
    closed.round = r;
    const float size =
        r >= 4 ? FLT_MAX : 1e37f * std::pow(3.0f, static_cast<float>(r));
    closed.mean = InChunks(std::vector<float>(n, r % 2 ? size : -size));
    const RoundRun run =
        RunRound(step, messages, closed, &*last,
                 {absl::MakeSpan(anchor), absl::MakeSpan(momentum)});
    ASSERT_TRUE(AllFinite(anchor)) << "round " << r;
    ASSERT_TRUE(AllFinite(momentum)) << "round " << r;
    for (uint32_t c = 0; c < 3; ++c) {
      const common::Range range = common::ChunkRange(n, c);
      std::vector<float> decoded(range.size());
      common::Decode(codec, (*run.update)[c]->payload(),
                     absl::MakeSpan(decoded));
      ASSERT_TRUE(AllFinite(decoded)) << "round " << r << " chunk " << c;
    }
    refused += run.stats.refused_chunks;
    last.emplace(run.update);
  }
  EXPECT_GT(refused, 0u);
  EXPECT_LT(refused, 5u * 3u) << "some steps near the limit fit";
}

INSTANTIATE_TEST_SUITE_P(
    CodecsAndMomenta, RefusedStepTest,
    ::testing::Combine(
        ::testing::Values(v1::CODEC_FP32, v1::CODEC_BF16, v1::CODEC_INT8),
        ::testing::Values(v1::MOMENTUM_HEAVY_BALL, v1::MOMENTUM_NESTEROV,
                          v1::MOMENTUM_DELAYED_NESTEROV)));

}  // namespace
}  // namespace co2::server
