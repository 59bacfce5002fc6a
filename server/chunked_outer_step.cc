#include "server/chunked_outer_step.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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
  o.momentum = c.momentum() == v1::MOMENTUM_NESTEROV ? MomentumKind::kNesterov
                                                     : MomentumKind::kHeavyBall;
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

ChunkedOuterStep::ChunkedOuterStep(const v1::JobConfig& config,
                                   size_t elements)
    : outer_(OuterConfigOf(config)),
      downlink_(v1::Codec(config.downlink_codec())),
      codec_(common::Codec(config.downlink_codec())),
      max_staleness_(config.max_staleness()),
      elements_(elements),
      num_chunks_(static_cast<uint32_t>(common::NumChunks(elements))) {}

std::shared_ptr<const v1::OuterUpdate> ChunkedOuterStep::Message(
    uint64_t round, uint32_t chunk_index, uint32_t contributors,
    std::string payload) const {
  auto msg = std::make_shared<v1::OuterUpdate>();
  msg->set_round(round);
  msg->set_anchor_round(round + 1 + max_staleness_);
  msg->set_chunk_index(chunk_index);
  msg->set_num_chunks(num_chunks_);
  msg->set_codec(downlink_);
  msg->set_contributors(contributors);
  msg->set_payload(std::move(payload));
  return msg;
}

// The gap is the last update as the workers decoded it: with the fp32
// downlink the last update's payload itself (in memory, or read back from
// its checkpoint into a chunk-sized buffer), else that payload decoded chunk
// by chunk into a scratch buffer (only the gap-aware penalty reads it). With
// the fp32 downlink the step writes U_{r+2} straight into the payload; other
// codecs write it to a scratch buffer, encode it and decode it back, so that
// the anchor adds the bits the workers add.
StepResult ChunkedOuterStep::Run(ClosedRound& closed, const KeptUpdate* last,
                                 const OuterStepBuffers& buffers) const {
  const bool fp32 = codec_ == common::Codec::kFp32;
  const bool reads_gap = outer_.penalty == GapPenalty::kGapAware;
  const KeptUpdate* gap_from = reads_gap ? last : nullptr;
  const size_t chunk_elements = std::min(elements_, common::kChunkElements);
  // Zeros: the gap before the first update, one no step reads or one that
  // cannot be read back, and m where β = 0.
  const std::vector<float> no_gap(chunk_elements);
  std::vector<float> fresh_momentum(buffers.momentum.empty() ? chunk_elements
                                                             : 0);
  // The last update's payload read back from its checkpoint; with other
  // codecs, that payload decoded, and U before encoding.
  std::string gap_bytes;
  std::vector<float> decoded_gap(!fp32 && gap_from != nullptr ? chunk_elements
                                                              : 0);
  std::vector<float> encoded_from(fp32 ? 0 : chunk_elements);
  StepResult result;
  auto chunks = std::make_shared<UpdateChunks>();
  chunks->reserve(num_chunks_);
  double penalty_sum = 0;
  for (uint32_t i = 0; i < num_chunks_; ++i) {
    const common::Range r = common::ChunkRange(elements_, i);
    std::vector<float>& mean = closed.mean[i];
    absl::Span<const float> gap = absl::MakeConstSpan(no_gap).first(r.size());
    if (gap_from != nullptr) {
      absl::StatusOr<std::string_view> bytes = gap_from->Payload(i, &gap_bytes);
      if (bytes.ok() &&
          bytes->size() != common::EncodedSize(codec_, r.size())) {
        bytes = absl::DataLossError(absl::StrCat(
            "the last update's chunk ", i, " has ", bytes->size(),
            " bytes, expected ", common::EncodedSize(codec_, r.size())));
      }
      if (!bytes.ok()) {
        if (result.gap_error.ok()) result.gap_error = bytes.status();
        ++result.unread_gap_chunks;
      } else if (fp32) {
        gap = Fp32Floats(*bytes);
      } else {
        const absl::Span<float> out =
            absl::MakeSpan(decoded_gap).first(r.size());
        common::Decode(codec_, *bytes, out);
        gap = out;
      }
    }
    absl::Span<float> momentum;
    if (buffers.momentum.empty()) {
      std::fill(fresh_momentum.begin(), fresh_momentum.end(), 0.0f);
      momentum = absl::MakeSpan(fresh_momentum).first(r.size());
    } else {
      momentum = buffers.momentum.subspan(r.begin, r.size());
    }
    std::string payload(common::EncodedSize(codec_, r.size()), '\0');
    absl::Span<float> update =
        fp32 ? Fp32Floats(payload)
             : absl::MakeSpan(encoded_from).first(r.size());
    AddStats(OuterStep(outer_, mean, gap, momentum, update), r.size(),
             &result.stats, &penalty_sum);
    std::vector<float>().swap(mean);
    if (!fp32) {
      common::Encode(codec_, update,
                     absl::MakeSpan(payload.data(), payload.size()));
    }
    // A += 1·decode(U) in one pass: what the workers apply
    // (AggregatorClient::ApplyUpdate), so both hold the same bits.
    common::AccumulateDecoded(codec_, payload, 1.0f,
                              buffers.anchor.subspan(r.begin, r.size()));
    chunks->push_back(
        Message(closed.round, i, closed.contributors, std::move(payload)));
  }
  result.stats.mean_penalty =
      elements_ == 0 ? 1.0 : penalty_sum / static_cast<double>(elements_);
  result.update = std::move(chunks);
  return result;
}

}  // namespace co2::server
