#include "server/job/chunked_outer_step.h"

#include <algorithm>
#include <cassert>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fnv_hash.h"
#include "common/layout.h"

namespace co2::server {
namespace {

// The floats of an fp32 payload, in place: a payload string's buffer is
// operator new's (or the string's own, for a few bytes), aligned for float.
absl::Span<float> Fp32Floats(std::string& bytes) {
  return absl::MakeSpan(reinterpret_cast<float*>(bytes.data()),
                        bytes.size() / sizeof(float));
}
absl::Span<const float> Fp32Floats(std::string_view bytes) {
  return absl::MakeConstSpan(reinterpret_cast<const float*>(bytes.data()),
                             bytes.size() / sizeof(float));
}

void AddStats(const OuterStepStats& chunk, size_t elements,
              OuterStepStats* total, double* penalty_sum) {
  *penalty_sum += chunk.mean_penalty * static_cast<double>(elements);
  total->momentum_norm_sq += chunk.momentum_norm_sq;
  total->clipped += chunk.clipped;
}

}  // namespace

OuterConfig OuterConfigOf(const v1::JobConfig& c) {
  OuterConfig o;
  o.alpha = c.alpha();
  o.beta = c.beta();
  switch (c.momentum()) {
    case v1::MOMENTUM_NESTEROV:
      o.momentum = MomentumKind::kNesterov;
      break;
    case v1::MOMENTUM_DELAYED_NESTEROV:
      o.momentum = MomentumKind::kDelayedNesterov;
      o.momentum_period = c.momentum_period();
      break;
    default:
      o.momentum = MomentumKind::kHeavyBall;
  }
  switch (c.gap_penalty()) {
    case v1::GAP_PENALTY_CONSTANT:
      o.penalty = GapPenalty::kConstant;
      break;
    case v1::GAP_PENALTY_GAP_AWARE:
      o.penalty = GapPenalty::kGapAware;
      break;
    default:
      o.penalty = GapPenalty::kNone;
  }
  o.penalty_lambda = c.penalty_lambda();
  switch (c.clip()) {
    case v1::CLIP_VALUE:
      o.clip = ClipMode::kValue;
      break;
    case v1::CLIP_ADAPTIVE:
      o.clip = ClipMode::kAdaptive;
      break;
    default:
      o.clip = ClipMode::kNone;
  }
  o.clip_value = c.clip_value();
  return o;
}

ShardStepConfig::ShardStepConfig(const v1::JobConfig& config,
                                   size_t elements)
    : outer_(OuterConfigOf(config)),
      codec_(common::Codec(config.downlink_codec())),
      elements_(elements),
      num_chunks_(static_cast<uint32_t>(common::NumChunks(elements))) {}

RoundStep::RoundStep(const ShardStepConfig& step, uint64_t round,
                     std::optional<KeptUpdate> last,
                     const OuterStepBuffers& buffers)
    : step_(step),
      round_(round),
      gap_(step.outer().penalty == GapPenalty::kGapAware ? std::move(last)
                                                         : std::nullopt),
      buffers_(buffers),
      stepped_(step.num_chunks(), false) {}

// The gap is the last update as the workers decoded it: with the fp32
// downlink the last update's payload itself (in memory, or read back from
// its checkpoint into a chunk-sized buffer), else that payload decoded into
// a scratch buffer (only the gap-aware penalty reads it; zeros without it).
// With the fp32 downlink the step writes U_{r+2} straight into the payload;
// other codecs write it to a scratch buffer, encode it and decode it back,
// so that the anchor adds the bits the workers add.
ChunkUpdate RoundStep::Step(uint32_t chunk_index, std::vector<float>& mean) {
  const common::Codec codec = step_.codec();
  const bool fp32 = codec == common::Codec::kFp32;
  const common::Range r = common::ChunkRange(step_.elements(), chunk_index);
  std::vector<float> gap_floats;  // the decoded gap (not fp32)
  std::string gap_bytes;          // the gap read back from its checkpoint
  absl::Span<const float> gap;
  if (gap_.has_value()) {
    absl::StatusOr<std::string_view> bytes =
        gap_->Payload(chunk_index, &gap_bytes);
    if (bytes.ok() && bytes->size() != common::EncodedSize(codec, r.size())) {
      bytes = absl::DataLossError(absl::StrCat(
          "the last update's chunk ", chunk_index, " has ", bytes->size(),
          " bytes, expected ", common::EncodedSize(codec, r.size())));
    }
    if (!bytes.ok()) {
      if (result_.gap_error.ok()) result_.gap_error = bytes.status();
      ++result_.unread_gap_chunks;
    } else if (fp32) {
      gap = Fp32Floats(*bytes);
    } else {
      gap_floats.resize(r.size());
      common::Decode(codec, *bytes, absl::MakeSpan(gap_floats));
      gap = gap_floats;
    }
  }
  if (gap.empty()) {
    // Zeros: one chunk's worth, shared by every step of the process.
    static const std::vector<float>* const kZeros =
        new std::vector<float>(common::kChunkElements, 0.0f);
    gap = absl::MakeConstSpan(*kZeros).first(r.size());
  }
  std::vector<float> fresh_momentum;  // m where β = 0: zeros
  absl::Span<float> momentum;
  if (buffers_.momentum.empty()) {
    fresh_momentum.assign(r.size(), 0.0f);
    momentum = absl::MakeSpan(fresh_momentum);
  } else {
    momentum = buffers_.momentum.subspan(r.begin, r.size());
  }
  // Zero bytes decode to zeros in every codec: a refused step's update.
  std::string payload(common::EncodedSize(codec, r.size()), '\0');
  const absl::Span<float> anchor = buffers_.anchor.subspan(r.begin, r.size());
  if (absl::Status fits = CheckStepFits(step_.outer(), mean, momentum, anchor);
      !fits.ok()) {
    if (result_.refused_error.ok()) {
      result_.refused_error = absl::Status(
          fits.code(), absl::StrCat("chunk ", chunk_index, ": ",
                                    fits.message()));
    }
    ++result_.stats.refused_chunks;
    penalty_sum_ += static_cast<double>(r.size());  // Λ = 1
    std::vector<float>().swap(mean);
    stepped_[chunk_index] = true;
    return ChunkUpdate{chunk_index, std::move(payload),
                       common::AnchorDigest(anchor)};
  }
  std::vector<float> encoded_from(fp32 ? 0 : r.size());  // U before encoding
  const absl::Span<float> update =
      fp32 ? Fp32Floats(payload) : absl::MakeSpan(encoded_from);
  AddStats(OuterStep(step_.outer(), round_, mean, gap, momentum, update),
           r.size(), &result_.stats, &penalty_sum_);
  std::vector<float>().swap(mean);
  if (!fp32) {
    common::Encode(codec, update,
                   absl::MakeSpan(payload.data(), payload.size()));
  }
  // A += 1·decode(U) in one pass: what the workers apply
  // (AggregatorClient::ApplyUpdate), so both hold the same bits.
  // The digest reads the chunk just written, while it is in cache.
  common::AccumulateDecoded(codec, payload, 1.0f, anchor);
  stepped_[chunk_index] = true;
  return ChunkUpdate{chunk_index, std::move(payload),
                     common::AnchorDigest(anchor)};
}

void RoundStep::Restore(uint32_t chunk_index) { stepped_[chunk_index] = true; }

std::vector<ChunkUpdate> RoundStep::StepRest(ClosedRound& closed) {
  std::vector<ChunkUpdate> rest;
  for (uint32_t c = 0; c < step_.num_chunks(); ++c) {
    if (!stepped(c)) rest.push_back(Step(c, closed.mean[c]));
  }
  return rest;
}

StepResult RoundStep::Finish() && {
  assert(std::find(stepped_.begin(), stepped_.end(), false) == stepped_.end());
  const size_t elements = step_.elements();
  result_.stats.mean_penalty =
      elements == 0 ? 1.0 : penalty_sum_ / static_cast<double>(elements);
  return std::move(result_);
}

}  // namespace co2::server
