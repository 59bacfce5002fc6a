// ContributionView: one contribution chunk as the Exchange service reads it
// off the wire. ContributionPayload: its payload made ready for RoundState
// before the shard's lock is taken: the codec parsed, the chunk index
// checked, and the values scanned for NaN/Inf (the expensive part), in place
// (common/payload_pieces.h).
//
// One ContributionPayload per call, on the caller's thread; it reads the
// view's pieces in place, so they must outlive it.
#ifndef CO2_SERVER_JOB_CONTRIBUTION_PAYLOAD_H_
#define CO2_SERVER_JOB_CONTRIBUTION_PAYLOAD_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/codec.h"
#include "common/payload_pieces.h"

namespace co2::server {

// The fields of a v1::Contribution, its payload in pieces that are read in
// place (common/payload_pieces.h). Borrowed for the duration of Contribute.
struct ContributionView {
  uint64_t round = 0;
  uint32_t chunk_index = 0;
  int codec = 0;  // a co2.v1.Codec wire value
  double weight = 0;
  common::Pieces payload;
};

class ContributionPayload {
 public:
  ContributionPayload() = default;
  ContributionPayload(const ContributionPayload&) = delete;
  ContributionPayload& operator=(const ContributionPayload&) = delete;

  // Reads `c` for a shard of `shard_elements`. INVALID_ARGUMENT for a codec
  // that is not one, or a chunk index out of range: a malformed request, not
  // counted against the worker. Values that fail validation are not an
  // error here: see valid().
  absl::Status Read(const ContributionView& c, size_t shard_elements);

  common::Codec codec() const { return codec_; }
  // The payload, as it lies in the view's pieces.
  common::Pieces pieces() const { return pieces_; }
  size_t bytes() const { return bytes_; }
  // Whether the values are valid for the chunk (size, NaN/Inf); a failure
  // counts against the worker.
  const absl::Status& valid() const { return valid_; }

 private:
  common::Codec codec_ = common::Codec::kFp32;
  common::Pieces pieces_;
  size_t bytes_ = 0;
  absl::Status valid_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_CONTRIBUTION_PAYLOAD_H_
