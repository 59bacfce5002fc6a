// AggregatorClient: a worker's connection to the aggregator shards of one
// job: all S of them (the local leader exchanges the whole model), or the
// shards one local rank owns when a node's ranks split the exchange
// (ClientOptions::owned_shards; then every span is that rank's slice of the
// model). It joins its shards, seeds or fetches the anchor, and then
// keeps one long-lived Exchange stream per shard with background threads that
// send the current contribution and receive outer updates, so the trainer
// never waits on the network unless an update is late.
//
// Buffers (the only model-sized state): one send buffer holding the encoded
// Δ of the latest pushed round (kept until its update arrives, for resends
// after a reconnect), one receive buffer holding the encoded update of one
// round, and for lossy uplink codecs the error-feedback residual.
//
// Threads: Push/WaitForUpdate/ApplyUpdate/Leave are called by one trainer
// thread; stats() from any thread. Internal threads per shard: one writer,
// one reader; plus one heartbeat thread. Every wait has a deadline.
//
// Shard state loss: the worker lends its anchor (TrackAnchor); if a shard
// restarts without the job's state, the stream re-seeds it from this
// worker's anchor (docs/reliability.md), so only the outer momentum is lost.
#ifndef CO2_CLIENT_AGGREGATOR_CLIENT_H_
#define CO2_CLIENT_AGGREGATOR_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "co2/v1/aggregator.pb.h"
#include "common/codec.h"
#include "common/layout.h"
#include "common/tls_config.h"

namespace co2::client {

struct ClientOptions {
  // host:port of each shard, in shard-index order (S = size()).
  std::vector<std::string> addresses;
  std::string job = "default";  // job name, shared by all workers
  std::string worker_id;        // unique per worker (node leader)
  // The job's settings; must match every other worker's. num_parameters and
  // num_shards are filled in by Connect from num_parameters (or the anchor)
  // and addresses.
  v1::JobConfig job_config;
  // The shards this client exchanges, as shard indices [begin, end) into
  // addresses (common::OwnedShards gives local rank k of L its part); unset:
  // all of them. With it, the anchor given to Connect and every span after
  // is the slice of the model those shards serve (common::RankRange), and
  // num_parameters must be the whole model's. The shards see one member per
  // node either way: every rank of a node joins under its worker_id.
  std::optional<common::Range> owned_shards;
  // The whole model's P; 0: the anchor's size (only without owned_shards).
  uint64_t num_parameters = 0;
  // This worker restarted without its state into a job it was a member of
  // (JoinRequest.rejoin): it may join the job after it finished, to end on
  // its final anchor.
  bool rejoin = false;
  // This worker stopped at a round boundary and resumes with the state it
  // saved there (JoinRequest.resume_round): it takes part from this round,
  // with the anchor given to Connect as that round's, and fetches nothing.
  // The shards must hold the job (FAILED_PRECONDITION if one lost it).
  std::optional<uint64_t> resume_round;
  common::Codec uplink_codec = common::Codec::kFp32;
  // TLS to the shards: ca_file verifies them; cert_file + key_file for mTLS.
  // Empty: plaintext (in-process and loopback tests only).
  common::TlsOptions tls;
  // The job's bearer token, sent with the job name on every call; needs tls.
  std::string token;
  absl::Duration rpc_timeout = absl::Seconds(30);       // one unary call
  absl::Duration connect_timeout = absl::Seconds(60);   // Connect overall
  absl::Duration reconnect_timeout = absl::Seconds(60); // give up on a shard
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
};

struct ClientStats {
  uint64_t rounds_pushed = 0;
  uint64_t updates_received = 0;
  uint64_t bytes_sent = 0;      // contribution payload bytes
  uint64_t bytes_received = 0;  // update payload bytes
  uint64_t broken_streams = 0;  // shard streams that broke and were retried
  uint64_t reconnects = 0;
  // Shard ranges whose anchor, after an update, did not match the digest the
  // shard sent with it (and were fetched again).
  uint64_t anchor_mismatches = 0;
  absl::Duration push_wait;     // time Push waited for the previous send
  absl::Duration update_wait;   // time WaitForUpdate waited (exposed comm.)
};

class AggregatorClient {
 public:
  // Joins its shards. `anchor` (size P, or the slice's size with
  // owned_shards; every span below is that size too) holds this worker's initial
  // parameters: a shard that tells this worker to seed gets them; otherwise
  // the shard's anchor is fetched into `anchor` (not with resume_round: then
  // `anchor` is the resumed round's). Fails with the shard's status
  // (e.g. FAILED_PRECONDITION for a JobConfig mismatch) or DEADLINE_EXCEEDED
  // after connect_timeout.
  static absl::StatusOr<std::unique_ptr<AggregatorClient>> Connect(
      ClientOptions options, absl::Span<float> anchor);
  ~AggregatorClient();  // stops the threads; does not Leave

  AggregatorClient(const AggregatorClient&) = delete;
  AggregatorClient& operator=(const AggregatorClient&) = delete;

  // The round this worker starts with (0 for a fresh job; later for a worker
  // that fetched the anchor of a running job).
  uint64_t start_round() const;
  const v1::JobConfig& job_config() const;
  // The elements of the whole model this client exchanges: [0, P), or the
  // owned shards' slice.
  common::Range slice() const;

  // Encodes `delta` (size P; error feedback for lossy codecs) into the send
  // buffer and hands it to the streams; returns once encoded. First waits until
  // the previous contribution is fully written and its update arrived.
  absl::Status Push(uint64_t round, absl::Span<const float> delta,
                    double weight, absl::Time deadline);

  // True once the update computed from `round` arrived from every shard.
  bool UpdateReady(uint64_t round) const;
  // Waits for that; DEADLINE_EXCEEDED, or the stream's error if a shard
  // rejected the contribution (e.g. INVALID_ARGUMENT, ABORTED).
  absl::Status WaitForUpdate(uint64_t round, absl::Time deadline);
  // anchor += decode(update of `round`), which must be ready; frees the receive
  // buffer for the next round. Returns the round of the resulting anchor.
  // `anchor` must be the tracked anchor if TrackAnchor was called.
  // Verifies each chunk of the result against the digest its shard sent
  // (OuterUpdate.anchor_digest, hashed while the chunk is in cache): a shard
  // range that differs is logged, counted (stats().anchor_mismatches) and
  // fetched again from its shard. If the shard closed a round meanwhile,
  // that range holds a later anchor until the updates it includes arrive
  // (they are then checked, not added again). DATA_LOSS naming the shard and
  // both rounds if the fetch fails or the shard's anchor is not within
  // max_staleness + 1 rounds ahead; the anchor must not be used then.
  absl::StatusOr<uint64_t> ApplyUpdate(uint64_t round, absl::Span<float> anchor);

  // Lends the client this worker's anchor A (P elements, the span that
  // ApplyUpdate adds into), so that a shard that lost the job's state is
  // re-seeded from it by the stream threads. The caller changes it only
  // through ApplyUpdate and keeps it alive as long as the client. Without
  // it, such a shard fails the stream with FAILED_PRECONDITION.
  // INVALID_ARGUMENT for a span of another size.
  absl::Status TrackAnchor(absl::Span<const float> anchor);

  // Checks `anchor` (size P) against the shards' anchor, bit for bit, chunk
  // by chunk through Fetch (P·4 bytes down, one chunk of scratch): OK when
  // every shard holds the anchor of `anchor_round` and its bits equal this
  // worker's range. Otherwise DATA_LOSS naming the shard, both anchor rounds,
  // the first element that differs and both FNV-1a hashes of the range (to
  // hash it, a mismatching shard's range is downloaded once more, whole).
  // Call it before Leave (a shard serves Fetch to members only).
  absl::Status VerifyAnchor(absl::Span<const float> anchor,
                            uint64_t anchor_round, absl::Time deadline);

  // The next ApplyUpdate adds the update with the lowest bit of its first
  // element flipped, as a fault in this worker's memory would.
  void CorruptNextUpdateForTesting();

  // The uplink codec's error-feedback residual (P floats; empty for fp32):
  // with the anchor and the round, what a worker saves to resume bit for
  // bit (resume_round). Trainer thread only, like Push.
  absl::Span<const float> residual() const;
  // Replaces it after a resume; INVALID_ARGUMENT for a span of another size
  // (a fp32 uplink has none: only an empty span).
  absl::Status RestoreResidual(absl::Span<const float> residual);

  // Leaves the job on every shard (best effort until `deadline`).
  absl::Status Leave(absl::Time deadline);

  ClientStats stats() const;

 private:
  class Impl;
  explicit AggregatorClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace co2::client

#endif  // CO2_CLIENT_AGGREGATOR_CLIENT_H_
