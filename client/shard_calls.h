// How a worker reaches one aggregator shard outside its Exchange stream: the
// channel, and one Seed, Fetch or Heartbeat call. Each function makes one
// attempt with the deadline it is given; retrying is the caller's
// (AggregatorClient retries UNAVAILABLE with backoff, ShardStream reconnects).
// Thread-safe: no state of their own.
#ifndef CO2_CLIENT_SHARD_CALLS_H_
#define CO2_CLIENT_SHARD_CALLS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "co2/v1/aggregator.grpc.pb.h"
#include "common/layout.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"

namespace co2::client {

// A channel to `address` whose reconnect backoff stays within
// [initial_backoff, max_backoff] (gRPC's own grows to 120 s, so after a shard
// restart the channel would keep failing calls long after the shard is
// back), and whose keepalive breaks the calls on a dead shard or link within
// about 20 s.
std::shared_ptr<grpc::Channel> MakeShardChannel(
    const std::string& address,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    absl::Duration initial_backoff, absl::Duration max_backoff);

// Uploads `range` (fp32, chunk by chunk) as the anchor of `anchor_round` with
// Seed; returns the anchor round the shard acknowledged once it is durable.
absl::StatusOr<uint64_t> SeedAnchor(v1::Aggregator::Stub* stub,
                                    const std::string& job,
                                    const std::string& worker_id,
                                    uint64_t anchor_round,
                                    absl::Span<const float> range,
                                    absl::Time deadline);

// Streams the shard's anchor (`elements` long, its whole range) with Fetch
// and hands each chunk, validated (size, NaN/Inf), to `visit` with its
// element range; returns the anchor round. An error from `visit` cancels the
// call and is returned; chunks of different anchor rounds are INTERNAL; a
// stream that ends before every chunk arrived is DATA_LOSS.
absl::StatusOr<uint64_t> FetchAnchorChunks(
    v1::Aggregator::Stub* stub, const std::string& job,
    const std::string& worker_id, size_t elements, absl::Time deadline,
    absl::FunctionRef<absl::Status(common::Range, const std::string&)> visit);

// Downloads the shard's anchor into `range` (the shard's whole range) with
// Fetch; returns its round.
absl::StatusOr<uint64_t> FetchAnchor(v1::Aggregator::Stub* stub,
                                     const std::string& job,
                                     const std::string& worker_id,
                                     absl::Span<float> range,
                                     absl::Time deadline);

// The shard's anchor against `range` (the shard's whole range), bit for bit,
// one chunk at a time (one chunk of scratch).
struct AnchorComparison {
  uint64_t anchor_round = 0;  // the round of the shard's anchor
  // The first element (within the range) whose bits differ; SIZE_MAX if none.
  size_t first_difference = SIZE_MAX;
};
absl::StatusOr<AnchorComparison> CompareAnchor(v1::Aggregator::Stub* stub,
                                               const std::string& job,
                                               const std::string& worker_id,
                                               absl::Span<const float> range,
                                               absl::Time deadline);

// Renews this worker's lease on the shard; returns what the shard answered.
struct LeaseRenewal {
  absl::Duration lease;  // the lease the shard grants
  // Why the shard holds updates back (HeartbeatResponse.update_held);
  // empty if it holds none.
  std::string update_held;
};
absl::StatusOr<LeaseRenewal> RenewLease(v1::Aggregator::Stub* stub,
                                        const std::string& job,
                                        const std::string& worker_id,
                                        absl::Time deadline);

}  // namespace co2::client

#endif  // CO2_CLIENT_SHARD_CALLS_H_
