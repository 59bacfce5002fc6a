// The outer step (server/job/outer_optimizer.h) of one shard's range, run
// chunk by chunk (RoundStep), and the update it produces: U encoded
// in the job's downlink codec, chunk by chunk, as payload bytes (the shard
// wraps them in messages: UpdateMessages, server/job/update_messages.h). The
// step's reductions are per block and chunks are whole blocks, so this is
// the step on the whole range, with no range-sized temporaries. The anchor
// adds exactly the bits the workers decode, so anchors stay bit-identical
// on both sides, and each chunk comes with the digest of its anchor after
// the update, which workers check theirs against.
//
// ShardStepConfig holds the job's constants for that step; const after
// construction, any thread. RoundStep (below) runs one round's step on
// state that is the caller's (A, m), borrowed.
#ifndef CO2_SERVER_JOB_CHUNKED_OUTER_STEP_H_
#define CO2_SERVER_JOB_CHUNKED_OUTER_STEP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "co2/v1/aggregator.pb.h"
#include "common/codec.h"
#include "server/job/outer_optimizer.h"
#include "server/job/round_state.h"
#include "server/storage/kept_update.h"

namespace co2::server {

// The outer step's settings in a job's config.
OuterConfig OuterConfigOf(const v1::JobConfig& config);

// The state one step changes, borrowed: spans over the whole range.
struct OuterStepBuffers {
  absl::Span<float> anchor;  // A: the decoded update is added to it
  // m; empty with β = 0, where each step starts it from zero.
  absl::Span<float> momentum;
};

// One chunk of a round's update: U_c encoded in the downlink codec, and the
// digest of the chunk's anchor after it (common::AnchorDigest).
struct ChunkUpdate {
  uint32_t chunk_index = 0;
  std::string payload;
  uint64_t anchor_digest = 0;
};

// What one round's step found, besides its chunks.
struct StepResult {
  OuterStepStats stats;
  // Chunks whose gap could not be read back from the checkpoint that keeps
  // the last update (an I/O error, or a file truncated under the shard):
  // stepped with a zero gap, as the first round is, so that the step still
  // runs whole; a step cannot stop halfway, A and m are changed chunk by
  // chunk. `gap_error` is the first such error.
  uint32_t unread_gap_chunks = 0;
  absl::Status gap_error;
  // The first chunk whose step was refused (stats.refused_chunks), naming
  // it and the bound that did not fit.
  absl::Status refused_error;
};

class ShardStepConfig {
 public:
  // `config` must have passed common::ValidateJobConfig; `elements` is the
  // size of the shard's range.
  ShardStepConfig(const v1::JobConfig& config, size_t elements);

  const OuterConfig& outer() const { return outer_; }
  size_t elements() const { return elements_; }
  uint32_t num_chunks() const { return num_chunks_; }

  common::Codec codec() const { return codec_; }

 private:
  const OuterConfig outer_;
  const common::Codec codec_;
  const size_t elements_;
  const uint32_t num_chunks_;
};

// One round's step: U_{r+2}, encoded chunk by chunk, and its decoded bits
// added to the anchor. Chunk by chunk, in any order and spread over time: a
// shard steps the chunks of a round that are complete while the rest of it
// still arrives, and sends their updates at once; the result is the same
// bits as stepping them in order at the close. Each chunk's mean is freed
// once its step has run, so the mean and U are not both whole at any time.
// `last` is the encoded update of the last closed round (nullopt before the
// first, or when none is kept): decoded, it is the gap (zeros without it),
// read one chunk at a time. Holds that copy of it (so the shard's cache may
// drop it); borrows `step` and the buffers, which must outlive it. Not
// thread-safe.
class RoundStep {
 public:
  RoundStep(const ShardStepConfig& step, uint64_t round,
            std::optional<KeptUpdate> last, const OuterStepBuffers& buffers);

  uint64_t round() const { return round_; }
  bool stepped(uint32_t chunk_index) const { return stepped_[chunk_index]; }
  // Steps chunk `chunk_index` (not stepped yet) with its mean, which is
  // freed, and returns its update.
  ChunkUpdate Step(uint32_t chunk_index, std::vector<float>& mean);
  // Chunk `chunk_index` was stepped before the shard restarted (the round
  // journal has its update, and the restored anchor and momentum include
  // it). Its stats are not in Finish's.
  void Restore(uint32_t chunk_index);
  // Steps every chunk not stepped yet, with closed.mean (freed): the rest
  // of the round at its close. Their updates, in chunk order.
  std::vector<ChunkUpdate> StepRest(ClosedRound& closed);
  // Once every chunk is stepped: the stats.
  StepResult Finish() &&;

 private:
  const ShardStepConfig& step_;
  const uint64_t round_;
  const std::optional<KeptUpdate> gap_;  // null unless the penalty reads it
  const OuterStepBuffers buffers_;
  std::vector<bool> stepped_;
  double penalty_sum_ = 0;
  StepResult result_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_CHUNKED_OUTER_STEP_H_
