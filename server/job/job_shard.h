// JobShard: everything one aggregator shard holds for one job. It owns the
// shard's slice of the anchor A, the outer momentum m (only with β != 0), the
// RoundState with its accumulators, the membership with leases, and the
// encoded updates of the last closed rounds (for workers that reconnect). The
// last update, decoded, is the staleness gap g of the next step, read chunk
// by chunk (RoundStep, server/job/chunked_outer_step.h). It streams: a
// chunk of the open round that every required worker has sent is stepped
// and its update sent before the round closes
// (JobShardOptions::stream_updates); with checkpoints, once the chunk is
// durable in the round journal (server/job/round_journal.h). Memory,
// in fp32 copies of the range: A, an accumulator per round that has chunks
// (one; two while workers are a round apart), m with β != 0, and the update of
// a closed round until its checkpoint is durable and the streams have sent it:
// from then on it is kept in its checkpoint (UpdateCache). Without checkpoints
// the cache keeps max_staleness + 1 rounds of updates in memory (in the
// downlink codec: 1 each for fp32, 1/2 for bf16, about 1/4 for int8). While
// workers fetch it, one snapshot of A that every fetch shares.
//
// The parts, each a unit under the shard's one mutex: ShardMembers (leases,
// evictions), SeedState (who seeds A), RoundState, StreamedRound (the open
// round's step while its chunks stream), UpdateCache (updates kept for
// replay), ShardDurability (when a checkpoint is due, what waits for one),
// CheckpointHealth (failing writes: logged, and the reason workers hear),
// SharedAnchorSnapshot, UpdateSinks and ShardReporter (the observer's round
// and poll reports); checkpoint_state.h writes and restores the state
// (called from job_shard_checkpoint.cc), RoundJournal the chunks streamed
// ahead of a round's checkpoint (job_shard_publish.cc: how updates go out,
// at once in memory or once durable).
//
// It is the logic behind the gRPC service (which validates and translates):
// no gRPC types, only the co2.v1 messages it publishes. Thread-safe: every
// public method may be called from any thread (one mutex). Sinks are called
// as UpdateSink states.
#ifndef CO2_SERVER_JOB_JOB_SHARD_H_
#define CO2_SERVER_JOB_JOB_SHARD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "co2/v1/aggregator.pb.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/layout.h"
#include "common/payload_pieces.h"
#include "server/job/anchor_snapshot.h"
#include "server/job/checkpoint_health.h"
#include "server/job/chunked_outer_step.h"
#include "server/job/contribution_payload.h"
#include "server/job/job_lifecycle.h"
#include "server/job/outer_optimizer.h"
#include "server/job/round_journal.h"
#include "server/job/round_state.h"
#include "server/job/seed_state.h"
#include "server/job/shard_durability.h"
#include "server/job/shard_members.h"
#include "server/job/shard_observer.h"
#include "server/job/shard_reporter.h"
#include "server/job/streamed_round.h"
#include "server/job/update_cache.h"
#include "server/job/update_messages.h"
#include "server/job/update_sinks.h"
#include "server/storage/checkpoint_store.h"
#include "server/storage/kept_update.h"

namespace co2::server {

struct JobShardOptions {
  uint32_t shard_index = 0;
  absl::Duration lease = absl::Seconds(10);  // membership without a heartbeat
  uint32_t max_workers = 1024;               // per job; RESOURCE_EXHAUSTED
  // A worker whose contribution chunks fail validation (NaN/Inf, bad size or
  // weight, values whose weighted sum would overflow fp32) this many times
  // in a row is evicted: removed from the rounds, and its
  // later calls get FAILED_PRECONDITION saying why. 0: never evict.
  uint32_t max_rejected_chunks = 3;
  // Where closed rounds are made durable before their update is released;
  // nullptr: no checkpoints. Borrowed; must outlive the shard.
  const CheckpointStore* checkpoints = nullptr;
  // Step each chunk of the open round as soon as every worker required for
  // the round has sent it, and send its update at once, while the rest of
  // the round still arrives (the downlink overlaps the uplink). With
  // checkpoints each such chunk is first appended to the round journal and
  // synced (nothing is sent before it is durable: docs/reliability.md). Same
  // bits either way.
  bool stream_updates = true;
  // How soon a failed checkpoint write is retried (its update waits).
  absl::Duration checkpoint_retry = absl::Seconds(1);
  // While checkpoint writes fail, at most one ERROR line per this long
  // (server/job/checkpoint_health.h).
  absl::Duration checkpoint_log_every = absl::Minutes(1);
  // Told about contributions, rounds and rejections (metrics); nullptr:
  // none. Borrowed; must outlive the shard. See shard_observer.h.
  ShardObserver* observer = nullptr;
  // Why this job has no state if a resuming worker finds it without an
  // anchor (logged and counted at the re-seed); set per job by JobRegistry.
  ReseedReason reseed_reason = ReseedReason::kMissing;
  // An OPEN job with no live worker for this long, rounds left, is
  // ABANDONED (server/job/job_lifecycle.h).
  absl::Duration abandon_after = absl::Minutes(10);
  // Whether and how a round's deadline adapts to observed completion times
  // (server/job/round_deadline.h); the job's round_timeout is the ceiling.
  RoundDeadlineOptions round_deadline;
};

struct JoinResult {
  bool must_seed = false;
  // A resuming worker found the job without state: it re-seeds the anchor.
  bool must_reseed = false;
  uint64_t open_round = 0;
  // The oldest round whose update the shard can replay (open_round if none).
  uint64_t oldest_update_round = 0;
};

struct JobShardStats {
  uint64_t rounds_closed = 0;
  uint64_t quorum_misses = 0;
  uint64_t quorum_closes = 0;
  uint64_t late_chunks = 0;       // folded into the next round
  uint64_t duplicate_chunks = 0;
  uint64_t live_workers = 0;
  // Failed validation (NaN/Inf, size), dropped; or held out of the mean by
  // the outlier rule.
  uint64_t rejected_chunks = 0;
  uint64_t evicted_workers = 0;   // after max_rejected_chunks in a row
  uint64_t held_out_chunks = 0;   // of those rejected, by the outlier rule
  // The largest contribution norm / its chunk's median in any round so far
  // (0 without JobConfig.outlier_ratio), logged when the job finishes.
  double max_norm_ratio = 0;
  uint64_t reseeds = 0;           // state lost; anchor re-seeded by a worker
  uint64_t checkpoints_written = 0;
  uint64_t checkpoint_failures = 0;
  // Chunks stepped with a zero gap: the last update could not be read back
  // from its checkpoint (see StepResult).
  uint64_t unread_gap_chunks = 0;
  // Chunks whose outer step was refused: their mean would have made the
  // momentum, the update or the anchor non-finite (CheckStepFits); they
  // stayed at the last good anchor with a zero update.
  uint64_t refused_step_chunks = 0;
  absl::Duration last_checkpoint_duration;
  OuterStepStats last_step;
};

class JobShard {
 public:
  // `config` must have passed common::ValidateJobConfig. `clock` is borrowed.
  static absl::StatusOr<std::unique_ptr<JobShard>> Create(
      std::string job, const v1::JobConfig& config,
      const JobShardOptions& options, common::Clock* clock);
  // A shard restarted from its checkpoint: anchor, momentum, the last update
  // (the next gap, and replayed to workers that missed it) and the round;
  // then the chunks of that round its journal holds (stepped and sent
  // before the restart: replayed, and their resends are duplicates).
  // Workers rejoin; contributions of the round in flight are resent by them.
  // DATA_LOSS for a journal chunk that does not fit the shard.
  ~JobShard();
  static absl::StatusOr<std::unique_ptr<JobShard>> Restore(
      LoadedCheckpoint checkpoint, const JobShardOptions& options,
      common::Clock* clock);

  const std::string& job() const { return job_; }
  const v1::JobConfig& config() const { return config_; }
  common::Range range() const { return range_; }
  uint32_t num_chunks() const;

  // Adds (or renews) `worker` with its uplink codec. A worker that was
  // training and reconnects passes the round it contributes next as
  // `resume_round`, and takes part from it without fetching the anchor. If
  // the job has no anchor then (this shard lost its state), that worker is
  // told to re-seed it (must_reseed), replacing a fresh seeder of A_0 that
  // has not finished; other resuming workers get UNAVAILABLE until the
  // re-seed completes. FAILED_PRECONDITION for a config that differs from
  // the job's; RESOURCE_EXHAUSTED past max_workers. A FINISHED job takes
  // only a `rejoin` (JobLifecycle::AdmitJoin); an ABANDONED one becomes
  // OPEN. UNAVAILABLE once the shard is retired (join again: the registry
  // holds the job's successor).
  absl::StatusOr<JoinResult> Join(const std::string& worker,
                                  const v1::JobConfig& config,
                                  common::Codec uplink,
                                  std::optional<uint64_t> resume_round = {},
                                  bool rejoin = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Heartbeat(const std::string& worker) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Leave(const std::string& worker) ABSL_LOCKS_EXCLUDED(mu_);
  // The codec `worker` joined with; NOT_FOUND for a worker that is not live.
  absl::StatusOr<common::Codec> UplinkCodec(const std::string& worker) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Writes chunk `chunk_index` of the anchor (fp32 bytes) that starts round
  // `anchor_round`: 0 (A_0) from a worker told must_seed; for a re-seed
  // (must_reseed) the round of the worker's anchor, the same in every chunk.
  // Only the worker told to seed, chunks in order; the anchor is ready after
  // the last one. `attempt` names the Seed stream (see SeedState::Accept):
  // chunk 0 of a new stream starts the seed over. A re-seeded shard opens
  // round anchor_round − max_staleness (0 if that is negative) with zero
  // momentum and gap, and logs and reports the re-seed.
  absl::Status SeedChunk(const std::string& worker, uint32_t chunk_index,
                         uint64_t anchor_round, const std::string& payload,
                         uint64_t* attempt = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // The Seed stream of `attempt` ended before its last chunk (cancelled,
  // broken, or a chunk refused): none of its chunks count, and the seeder's
  // next Seed starts afresh. Nothing to do once the anchor is ready.
  void AbandonSeed(uint64_t attempt) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `done` (on the poller thread, or at once without checkpoints) when
  // the state as of now is in a durable checkpoint; with UNAVAILABLE if the
  // shard is destroyed first.
  void NotifyWhenDurable(std::function<void(absl::Status)> done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The whole current anchor; marks `worker` as entering the round it names.
  // Fetches of the same anchor share one snapshot. UNAVAILABLE while another
  // worker seeds the anchor (or none does yet), FAILED_PRECONDITION for the
  // worker told to seed it (it must Seed, a retry cannot succeed), and
  // UNAVAILABLE while part of the anchor has moved on (streaming)
  // if no worker was waiting to fetch when the round's first chunks were
  // stepped (the shard then keeps no copy of their old values).
  absl::StatusOr<std::shared_ptr<const AnchorSnapshot>> Fetch(
      const std::string& worker)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Validates and accumulates one contribution chunk (see RoundState).
  absl::Status Contribute(const std::string& worker, const ContributionView& c)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same for a parsed message (its payload is one piece).
  absl::Status Contribute(const std::string& worker, const v1::Contribution& c)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Registers a sink (held weakly) and replays to it, before any later
  // update, the kept updates of rounds >= from_round (those kept in a
  // checkpoint are read chunk by chunk as they are sent) and the chunks of
  // the open round streamed so far.
  // FAILED_PRECONDITION, naming the oldest round held, when from_round is
  // older than that (the open round when none is held): an update the
  // caller asked for is gone, and it cannot follow without fetching.
  absl::Status Subscribe(const std::shared_ptr<UpdateSink>& sink,
                         uint64_t from_round) ABSL_LOCKS_EXCLUDED(mu_);

  // Expires leases and closes the open round if it can close; runs the outer
  // step, writes the checkpoint and then publishes to the sinks; streams the
  // open round's complete chunks (stream_updates), journaled first with
  // checkpoints. Returns how many rounds were published. One thread at a
  // time (the registry poller).
  int Poll() ABSL_LOCKS_EXCLUDED(mu_);
  // The earliest time Poll has work to do without new input (a round
  // deadline or a lease expiry); InfiniteFuture if none.
  absl::Time NextDeadline() const ABSL_LOCKS_EXCLUDED(mu_);

  JobShardStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Why updates are held from the workers: "checkpoint failing: " and the
  // errno text while the job's durable writes fail; empty otherwise.
  std::string UpdateHeld() const ABSL_LOCKS_EXCLUDED(mu_);
  // The job as co2-admin lists it (in_memory set).
  v1::JobSummary Summary() const ABSL_LOCKS_EXCLUDED(mu_);
  // Retires the shard if it is not OPEN, has not been for `retention`, and
  // its state is in its checkpoint (nothing left to write; always without
  // checkpoints): later Joins get UNAVAILABLE, and the registry stops
  // polling it and forgets it. True if retired.
  bool RetireIfExpired(absl::Duration retention) ABSL_LOCKS_EXCLUDED(mu_);
  // Retires the shard for a deletion; FAILED_PRECONDITION naming the live
  // workers of an OPEN job that has any.
  absl::Status RetireForDelete() ABSL_LOCKS_EXCLUDED(mu_);
  // The anchor and its round, for tests comparing with workers.
  std::vector<float> AnchorForTesting(uint64_t* anchor_round) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static absl::StatusOr<std::unique_ptr<JobShard>> Build(
      std::string job, const v1::JobConfig& config,
      const JobShardOptions& options, common::Clock* clock,
      uint64_t first_round);
  JobShard(std::string job, const v1::JobConfig& config,
           const JobShardOptions& options, common::Range range,
           common::Clock* clock, uint64_t first_round);
  uint64_t AnchorRoundLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The last chunk of a re-seed arrived: the shard continues from it.
  void FinishReseedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `worker` is gone (left, evicted, lease expired): rounds close without
  // it, and it no longer seeds.
  void ForgetWorkerLocked(const std::string& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a contribution chunk that failed validation (`invalid`, its
  // message naming the round and chunk) and evicts the worker after
  // max_rejected_chunks in a row; returns the status for the worker.
  // `member` is `worker`'s entry, erased when it is evicted.
  absl::Status RejectLocked(const std::string& worker, ShardMember& member,
                            const absl::Status& invalid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs and counts contributions to `round` held out by the outlier rule
  // (JobConfig.outlier_ratio), and evicts a worker held out in
  // max_rejected_chunks rounds in a row.
  void HoldOutLocked(uint64_t round, const std::vector<HeldOut>& held_out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ShardMembers evicted `worker` (rejected or held out too often in a
  // row): it is forgotten, counted, and the checkpoint's membership is due.
  void EvictedLocked(const std::string& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Expires leases, closes the rounds that can close and moves the job
  // along its lifecycle.
  void AdvanceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lifecycle's part of AdvanceLocked: logs a change and makes it
  // durable; a job that leaves OPEN leaves the metrics.
  void UpdateLifecycleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CloseRoundLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Poll without checkpoints: closed rounds and complete chunks go out at
  // once.
  int PollInMemory() ABSL_LOCKS_EXCLUDED(mu_);
  // Poll's checkpoint half: writes the checkpoint when a round closed or
  // membership changed, then publishes the closed rounds.
  int PublishDurably() ABSL_LOCKS_EXCLUDED(mu_);
  // Steps the open round's complete chunks, journals them and sends them.
  void StreamDurably() ABSL_LOCKS_EXCLUDED(mu_);
  // A durable write (`what`) failed with `error`, or succeeded: counted,
  // told to the observer and logged (rate-limited by CheckpointHealth).
  void WriteFailedLocked(absl::string_view what, const absl::Status& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteSucceededLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendToSinks(
      const std::vector<std::shared_ptr<const UpdateChunks>>& updates,
      const std::vector<std::shared_ptr<UpdateSink>>& sinks)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Begins the step of `round` (the open round, or the one closing) unless
  // it has begun.
  void BeginStepLocked(uint64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A chunk stepped ahead of its round's close, not sent yet; its senders
  // only with checkpoints (for the journal).
  struct SteppedChunk {
    std::shared_ptr<const v1::OuterUpdate> update;
    std::vector<ChunkSender> senders;
  };
  // Steps the open round's complete chunks ahead of its close (with
  // stream_updates; with checkpoints only once the round's base is durable:
  // the anchor checkpointed, the last closed round's checkpoint written, no
  // journal failure this round); empty if none.
  std::vector<SteppedChunk> StepCompleteChunksLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks stepped chunks as sent (replayed to streams that start later) and
  // returns their updates, to send.
  UpdateChunks ReleaseLocked(std::vector<SteppedChunk>& stepped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends stepped chunks of `round` to the journal, with their A and m.
  // Without the lock, as WriteCheckpoint.
  absl::Status WriteJournal(uint64_t round,
                            const std::vector<SteppedChunk>& stepped)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Restore's second half: the journal's chunks of the open round.
  absl::Status RestoreJournalLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes A, m and the last update; returns the update as written. Runs
  // without the lock: that state only changes in CloseRoundLocked and
  // Publish, on the same (poller) thread.
  absl::StatusOr<std::shared_ptr<const CheckpointedUpdate>> WriteCheckpoint(
      const v1::ShardCheckpointHeader& header) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  v1::ShardCheckpointHeader CheckpointHeaderLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeasesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Contribute without telling the observer about a rejection.
  absl::Status ContributeUnobserved(const std::string& worker,
                                    const ContributionView& c)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::string job_;
  const v1::JobConfig config_;
  const JobShardOptions options_;
  const common::Range range_;
  const ShardStepConfig step_;
  const UpdateMessages messages_;
  common::Clock* const clock_;

  mutable absl::Mutex mu_;
  RoundState rounds_ ABSL_GUARDED_BY(mu_);
  ShardMembers members_ ABSL_GUARDED_BY(mu_);
  SeedState seed_ ABSL_GUARDED_BY(mu_);
  bool anchor_ready_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<float> anchor_ ABSL_GUARDED_BY(mu_);
  // m; empty with β = 0, where each step starts it from zero.
  std::vector<float> momentum_ ABSL_GUARDED_BY(mu_);
  // The open round's step once a chunk of it was streamed, until it closes.
  // A fetch meanwhile is served the anchor the round started from where
  // the step kept it: when a joined worker had yet to fetch as the round's
  // first chunks were stepped; a fetch that finds it missing
  // (StartAnchorWhole) is told to retry. Otherwise no copy: it would cost
  // up to a range of memory.
  StreamedRound streamed_ ABSL_GUARDED_BY(mu_);
  // The snapshot the fetches in progress share; dropped when the anchor moves
  // (once seeded, only a round's close moves it).
  SharedAnchorSnapshot snapshot_ ABSL_GUARDED_BY(mu_);
  uint64_t rounds_closed_ ABSL_GUARDED_BY(mu_) = 0;
  // Encoded updates of the last closed rounds: those whose checkpoint is not
  // durable yet (not yet sent), and those kept for reconnecting workers.
  UpdateCache updates_ ABSL_GUARDED_BY(mu_);
  ShardDurability durability_ ABSL_GUARDED_BY(mu_);
  CheckpointHealth checkpoint_health_ ABSL_GUARDED_BY(mu_);
  // With checkpoints: the chunks streamed ahead of their round's checkpoint
  // (null without); touched by the poller thread only.
  const std::unique_ptr<RoundJournal> journal_;
  UpdateSinks sinks_ ABSL_GUARDED_BY(mu_);
  JobShardStats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t restored_quorum_misses_ ABSL_GUARDED_BY(mu_) = 0;
  // Rounds and polls, told to the observer.
  ShardReporter report_ ABSL_GUARDED_BY(mu_);
  JobLifecycle lifecycle_ ABSL_GUARDED_BY(mu_);
  // Retired (RetireIfExpired, RetireForDelete): the registry no longer
  // holds the shard; it only finishes the calls in flight.
  bool retired_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_JOB_SHARD_H_
