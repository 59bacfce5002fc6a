// JobShard: everything one aggregator shard holds for one job. It owns the
// shard's slice of the anchor A, the outer momentum m, the last decoded outer
// update (the staleness gap g of the next step), the RoundState with its
// accumulators, the membership with leases, and the encoded updates of the
// last two rounds (for workers that reconnect). Memory: 3 + 2 (accumulators)
// fp32 copies of the range, plus the cached encoded updates.
//
// It is the logic behind the gRPC service (which validates and translates):
// no gRPC types, only the co2.v1 messages it publishes. Thread-safe: every
// public method may be called from any thread (one mutex). Sinks are called
// without the lock held.
#ifndef CO2_SERVER_JOB_SHARD_H_
#define CO2_SERVER_JOB_SHARD_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "co2/v1/aggregator.pb.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/layout.h"
#include "server/outer_optimizer.h"
#include "server/round_state.h"

namespace co2::server {

// The chunks of one round's outer update, shared by every stream sending them.
using UpdateChunks = std::vector<std::shared_ptr<const v1::OuterUpdate>>;

// Receives the updates of every round that closes. Implemented by the Exchange
// streams; held weakly, so a stream that ends simply stops receiving.
class UpdateSink {
 public:
  virtual ~UpdateSink() = default;
  virtual void Send(std::shared_ptr<const UpdateChunks> update) = 0;
};

struct JobShardOptions {
  uint32_t shard_index = 0;
  absl::Duration lease = absl::Seconds(10);  // membership without a heartbeat
  uint32_t max_workers = 1024;               // per job; RESOURCE_EXHAUSTED
};

struct JoinResult {
  bool must_seed = false;
  uint64_t open_round = 0;
};

// One chunk of the anchor, copied out under the lock.
struct AnchorSnapshot {
  uint64_t anchor_round = 0;
  std::vector<std::string> chunks;  // fp32 bytes, chunk by chunk
};

struct JobShardStats {
  uint64_t rounds_closed = 0;
  uint64_t quorum_misses = 0;
  uint64_t quorum_closes = 0;
  uint64_t late_chunks = 0;       // folded into the next round
  uint64_t duplicate_chunks = 0;
  uint64_t live_workers = 0;
  OuterStepStats last_step;
};

class JobShard {
 public:
  // `config` must have passed common::ValidateJobConfig. `clock` is borrowed.
  static absl::StatusOr<std::unique_ptr<JobShard>> Create(
      std::string job, const v1::JobConfig& config,
      const JobShardOptions& options, common::Clock* clock);

  const v1::JobConfig& config() const { return config_; }
  common::Range range() const { return range_; }
  uint32_t num_chunks() const;

  // Adds (or renews) `worker` with its uplink codec. FAILED_PRECONDITION for a
  // config that differs from the job's; RESOURCE_EXHAUSTED past max_workers.
  absl::StatusOr<JoinResult> Join(const std::string& worker,
                                  const v1::JobConfig& config,
                                  common::Codec uplink) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Heartbeat(const std::string& worker) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Leave(const std::string& worker) ABSL_LOCKS_EXCLUDED(mu_);
  // The codec `worker` joined with; NOT_FOUND for a worker that is not live.
  absl::StatusOr<common::Codec> UplinkCodec(const std::string& worker) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Writes chunk `chunk_index` of A_0 (fp32 bytes). Only the worker told to
  // seed, chunks in order; the anchor is ready after the last one.
  absl::Status SeedChunk(const std::string& worker, uint32_t chunk_index,
                         const std::string& payload) ABSL_LOCKS_EXCLUDED(mu_);
  // The whole current anchor; marks `worker` as entering the round it names.
  // UNAVAILABLE while no anchor is seeded.
  absl::StatusOr<AnchorSnapshot> Fetch(const std::string& worker)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Validates and accumulates one contribution chunk (see RoundState).
  absl::Status Contribute(const std::string& worker, const v1::Contribution& c)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Registers a sink and returns the cached updates of rounds >= from_round.
  std::vector<std::shared_ptr<const UpdateChunks>> Subscribe(
      std::weak_ptr<UpdateSink> sink, uint64_t from_round)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Expires leases and closes the open round if it can close; runs the outer
  // step and publishes to the sinks. Returns how many rounds closed.
  int Poll() ABSL_LOCKS_EXCLUDED(mu_);
  // The earliest time Poll has work to do without new input (a round
  // deadline or a lease expiry); InfiniteFuture if none.
  absl::Time NextDeadline() const ABSL_LOCKS_EXCLUDED(mu_);

  JobShardStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // The anchor and its round, for tests comparing with workers.
  std::vector<float> AnchorForTesting(uint64_t* anchor_round) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Member {
    common::Codec uplink = common::Codec::kFp32;
    absl::Time lease_expiry;
  };

  JobShard(std::string job, const v1::JobConfig& config,
           const JobShardOptions& options, common::Range range,
           common::Clock* clock);
  uint64_t AnchorRoundLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<std::shared_ptr<const UpdateChunks>> CloseRoundLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<const UpdateChunks> EncodeUpdateLocked(
      const ClosedRound& closed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeasesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::shared_ptr<UpdateSink>> LiveSinksLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string job_;
  const v1::JobConfig config_;
  const JobShardOptions options_;
  const common::Range range_;
  const OuterConfig outer_;
  common::Clock* const clock_;

  mutable absl::Mutex mu_;
  RoundState rounds_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);
  std::string seeder_ ABSL_GUARDED_BY(mu_);
  uint32_t seeded_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  bool anchor_ready_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<float> anchor_ ABSL_GUARDED_BY(mu_);
  std::vector<float> momentum_ ABSL_GUARDED_BY(mu_);
  std::vector<float> last_update_ ABSL_GUARDED_BY(mu_);  // decoded U: the gap
  uint64_t rounds_closed_ ABSL_GUARDED_BY(mu_) = 0;
  // Encoded updates of the last two closed rounds, oldest first.
  std::vector<std::shared_ptr<const UpdateChunks>> cache_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<UpdateSink>> sinks_ ABSL_GUARDED_BY(mu_);
  JobShardStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_SHARD_H_
