#include "server/job/streamed_round.h"

#include <cassert>
#include <utility>

#include "common/layout.h"

namespace co2::server {

StreamedRound::StreamedRound(const ShardStepConfig& step,
                             const UpdateMessages& messages)
    : step_(step), messages_(messages) {}

void StreamedRound::Begin(uint64_t round, std::optional<KeptUpdate> last,
                          const OuterStepBuffers& buffers) {
  assert(!active());
  step_of_round_.emplace(step_, round, std::move(last), buffers);
  anchor_ = buffers.anchor;
  update_.assign(step_.num_chunks(), nullptr);
}

std::shared_ptr<const v1::OuterUpdate> StreamedRound::Step(
    uint32_t chunk_index, std::vector<float>& mean, uint32_t contributors,
    const std::vector<HeldOut>& held_out, bool keep_start) {
  if (keep_start) {
    start_anchor_.resize(step_.num_chunks());
    const common::Range r = common::ChunkRange(step_.elements(), chunk_index);
    const absl::Span<const float> start = anchor_.subspan(r.begin, r.size());
    start_anchor_[chunk_index].assign(start.begin(), start.end());
  }
  return Keep(contributors, step_of_round_->Step(chunk_index, mean),
              held_out);
}

std::shared_ptr<const v1::OuterUpdate> StreamedRound::Restore(
    uint32_t chunk_index, uint32_t contributors, std::string payload,
    uint64_t anchor_digest) {
  step_of_round_->Restore(chunk_index);
  return Keep(contributors,
              ChunkUpdate{chunk_index, std::move(payload), anchor_digest});
}

StreamedRound::Closed StreamedRound::Close(ClosedRound& closed) {
  for (ChunkUpdate& chunk : step_of_round_->StepRest(closed)) {
    const uint32_t contributors = ChunkContributors(
        closed.contributors, closed.held_out, chunk.chunk_index);
    Keep(contributors, std::move(chunk), closed.held_out);
  }
  Closed result{std::move(*step_of_round_).Finish(),
                std::make_shared<const UpdateChunks>(std::move(update_))};
  step_of_round_.reset();
  anchor_ = {};
  update_.clear();
  start_anchor_.clear();
  return result;
}

bool StreamedRound::StartAnchorWhole() const {
  if (!active()) return true;
  for (uint32_t c = 0; c < step_.num_chunks(); ++c) {
    if (step_of_round_->stepped(c) &&
        (c >= start_anchor_.size() || start_anchor_[c].empty())) {
      return false;
    }
  }
  return true;
}

std::shared_ptr<const v1::OuterUpdate> StreamedRound::Keep(
    uint32_t contributors, ChunkUpdate chunk,
    const std::vector<HeldOut>& held_out) {
  const uint32_t c = chunk.chunk_index;
  update_[c] =
      messages_.Make(step_of_round_->round(), c, contributors,
                     std::move(chunk.payload), chunk.anchor_digest, held_out);
  return update_[c];
}

}  // namespace co2::server
