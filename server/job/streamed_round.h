// StreamedRound: the open round's outer step while its complete chunks are
// stepped and sent ahead of its close (JobShardOptions::stream_updates):
// the round's RoundStep, the messages of the chunks stepped so far and, for
// workers that fetch the anchor meanwhile, the anchor the round started
// from in the chunks already stepped. Until the round closes, the shard's
// anchor is the old one in the chunks not stepped yet and the new one in
// the others.
//
// Borrows the job's step and messages, and from Begin to Close the shard's
// A and m. Not thread-safe (the shard's mutex).
#ifndef CO2_SERVER_JOB_STREAMED_ROUND_H_
#define CO2_SERVER_JOB_STREAMED_ROUND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "co2/v1/aggregator.pb.h"
#include "server/job/chunked_outer_step.h"
#include "server/job/round_state.h"
#include "server/job/update_messages.h"
#include "server/storage/kept_update.h"

namespace co2::server {

class StreamedRound {
 public:
  StreamedRound(const ShardStepConfig& step, const UpdateMessages& messages);

  // Whether a round's step has begun and not closed.
  bool active() const { return step_of_round_.has_value(); }
  uint64_t round() const { return step_of_round_->round(); }  // while active
  bool stepped(uint32_t chunk_index) const {
    return active() && step_of_round_->stepped(chunk_index);
  }

  // Begins the step of `round` (none active): `last` is the last closed
  // round's update (RoundStep: its gap), `buffers` the shard's A and m.
  void Begin(uint64_t round, std::optional<KeptUpdate> last,
             const OuterStepBuffers& buffers);
  // Steps chunk `chunk_index` (not stepped yet) with its mean (freed) and
  // returns the message carrying its update, counted from `contributors`
  // and naming the contributions `held_out` of it.
  // With `keep_start`, the chunk's anchor is copied first, for fetches.
  std::shared_ptr<const v1::OuterUpdate> Step(
      uint32_t chunk_index, std::vector<float>& mean, uint32_t contributors,
      const std::vector<HeldOut>& held_out, bool keep_start);
  // Chunk `chunk_index` was stepped before the shard restarted (the round
  // journal has its update, `payload`, and the restored A and m include
  // it); returns its message.
  std::shared_ptr<const v1::OuterUpdate> Restore(uint32_t chunk_index,
                                                 uint32_t contributors,
                                                 std::string payload,
                                                 uint64_t anchor_digest);

  // The round closed: its step with the chunks not stepped yet run with
  // closed.mean (freed) and closed.contributors less each chunk's
  // closed.held_out, and its whole update in chunk order. None is active
  // after.
  struct Closed {
    StepResult result;
    std::shared_ptr<const UpdateChunks> update;
  };
  Closed Close(ClosedRound& closed);

  // Whether the anchor the round started from is known for every stepped
  // chunk (so for all, with the shard's anchor); true while none is active.
  bool StartAnchorWhole() const;
  // Chunk by chunk, that anchor where a chunk was stepped (empty where not),
  // for MakeAnchorSnapshot.
  const std::vector<std::vector<float>>& start_anchor() const {
    return start_anchor_;
  }

 private:
  std::shared_ptr<const v1::OuterUpdate> Keep(
      uint32_t contributors, ChunkUpdate chunk,
      const std::vector<HeldOut>& held_out = {});

  const ShardStepConfig& step_;
  const UpdateMessages& messages_;
  std::optional<RoundStep> step_of_round_;
  absl::Span<const float> anchor_;        // the shard's A, from Begin
  UpdateChunks update_;                   // null until stepped
  std::vector<std::vector<float>> start_anchor_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_STREAMED_ROUND_H_
