#include "server/job/contribution_payload.h"

#include "absl/strings/str_cat.h"
#include "common/layout.h"
#include "common/status_macros.h"

namespace co2::server {

absl::Status ContributionPayload::Read(const ContributionView& c,
                                       size_t shard_elements) {
  CO2_ASSIGN_OR_RETURN(codec_, common::CodecFromWire(c.codec));
  const size_t num_chunks = common::NumChunks(shard_elements);
  if (c.chunk_index >= num_chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_index ", c.chunk_index, " out of range: shard has ",
                     num_chunks, " chunks"));
  }
  const size_t elements =
      common::ChunkRange(shard_elements, c.chunk_index).size();
  pieces_ = c.payload;
  bytes_ = common::TotalSize(pieces_);
  valid_ = common::ValidatePieces(codec_, pieces_, elements);
  return absl::OkStatus();
}

}  // namespace co2::server
