// AnchorSnapshot: one shard's anchor copied out as the Fetch messages that
// carry it, immutable once made. SharedAnchorSnapshot hands every fetch of
// the same anchor the one snapshot made for the first of them (workers fetch
// together: a job's start, a shard's restart), so a crowd of fetches costs
// one copy of the anchor; it keeps the snapshot only while someone holds it.
//
// MakeAnchorSnapshot is a pure function; any thread. SharedAnchorSnapshot is
// not thread-safe: the owner serialises calls (server::JobShard holds a
// mutex). A snapshot, once handed out, may be read from any thread.
#ifndef CO2_SERVER_JOB_ANCHOR_SNAPSHOT_H_
#define CO2_SERVER_JOB_ANCHOR_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "co2/v1/aggregator.pb.h"

namespace co2::server {

// The anchor as the Fetch messages that carry it (anchor_round, chunk_index
// and fp32 payload set); immutable and shared by every fetch of the same
// anchor.
struct AnchorSnapshot {
  uint64_t anchor_round = 0;
  std::vector<v1::AnchorChunk> chunks;
};

// `anchor` (a shard's whole range), chunk by chunk, as the anchor of
// `anchor_round`; chunk c is taken from `unstepped[c]` instead where that is
// given and not empty (a chunk the next round's step has already moved:
// JobShard streams updates).
std::shared_ptr<const AnchorSnapshot> MakeAnchorSnapshot(
    uint64_t anchor_round, absl::Span<const float> anchor,
    absl::Span<const std::vector<float>> unstepped = {});

class SharedAnchorSnapshot {
 public:
  // The snapshot the fetches in progress share; made by MakeAnchorSnapshot
  // if there is none (nobody holds it any more, or Reset).
  std::shared_ptr<const AnchorSnapshot> Get(
      uint64_t anchor_round, absl::Span<const float> anchor,
      absl::Span<const std::vector<float>> unstepped = {});
  // The anchor moved: the next Get makes a new snapshot. Those already
  // handed out are unchanged.
  void Reset() { snapshot_.reset(); }

 private:
  std::weak_ptr<const AnchorSnapshot> snapshot_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_ANCHOR_SNAPSHOT_H_
