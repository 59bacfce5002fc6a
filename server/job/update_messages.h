// UpdateMessages: the wire messages of a job's updates on one shard
// (UpdateChunks, server/storage/update_chunks.h), made from what the outer
// step produced (server/job/chunked_outer_step.h: payload bytes and an
// anchor digest per chunk).
#ifndef CO2_SERVER_JOB_UPDATE_MESSAGES_H_
#define CO2_SERVER_JOB_UPDATE_MESSAGES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "co2/v1/aggregator.pb.h"
#include "server/job/chunk_screen.h"
#include "server/storage/update_chunks.h"

namespace co2::server {

// The messages of one job's updates on one shard: the job's downlink codec
// and staleness, and the shard's chunk count. A value; const, any thread.
class UpdateMessages {
 public:
  // `config` must have passed common::ValidateJobConfig.
  UpdateMessages(const v1::JobConfig& config, uint32_t num_chunks);

  // The message carrying chunk `chunk_index` of the update of `round`
  // (`payload`, in the downlink codec), counted from `contributors`, with
  // the digest of the chunk's anchor after it (common::AnchorDigest; 0 if
  // not known), naming the contributions of `held_out` in that chunk.
  std::shared_ptr<const v1::OuterUpdate> Make(
      uint64_t round, uint32_t chunk_index, uint32_t contributors,
      std::string payload, uint64_t anchor_digest,
      const std::vector<HeldOut>& held_out = {}) const;

 private:
  v1::Codec downlink_;
  uint64_t max_staleness_;
  uint32_t num_chunks_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_UPDATE_MESSAGES_H_
