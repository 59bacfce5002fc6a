// The round state machine of one (job, shard): membership of the round,
// streaming accumulation of contributions, and when a round may close.
// Pure logic with an injectable clock and no I/O; it owns the sums of the
// open round r and of r + 1, one per chunk (server/job/chunk_sum.h: memory
// taken at the chunk's first contribution; once the round's means are handed
// to the caller, a sum object is kept for reuse by later rounds), so its
// memory is at most two rounds' sums, whatever the number of workers: two
// fp32 copies of the shard, or four with exact sums (8 bytes per element).
//
// Rules (docs/algorithm.md, "Round rules"):
//  - Accepted rounds are r − 1, r and r + 1 (r = open round). A chunk of r − 1
//    (a straggler's) is folded into r; older is ABORTED; newer than r + 1 is
//    FAILED_PRECONDITION.
//  - Each (worker, round, chunk) counts once; a resend is accepted, ignored.
//  - Weights are kept per chunk: the mean of chunk c is Σ w·Δ_c / Σ w.
//  - With outlier_ratio k > 0 and at least 3 contributions to a chunk, one
//    whose norm w·||Δ_c|| is more than k × the median of the chunk's norms
//    is held out of its mean (server/job/chunk_screen.h): it still counts
//    as sent (the round's completeness), not in the mean or its weights.
//  - Round r closes when every live worker required for it (first_round <= r)
//    has sent all chunks of r; or at its deadline (round_timeout after the
//    round opened with a chunk in it, or after its first chunk) when at least
//    min_workers did. A round never closes with no complete contribution.
//  - A worker a round closed without at its deadline is not required again
//    until it sends a chunk: a stopped, cut-off or dead worker costs the job
//    one deadline, not one per round until its lease expires.
//  - A chunk of r that every live worker required for r has sent can be taken
//    ahead of the round's close (TakeCompleteChunks: the shard streams its
//    update while the rest of the round arrives). A contribution to a chunk
//    taken ahead, of r or a straggler's of r − 1, is folded into r + 1.
//
// Not thread-safe: the owner serialises calls (server::JobShard holds a mutex).
#ifndef CO2_SERVER_JOB_ROUND_STATE_H_
#define CO2_SERVER_JOB_ROUND_STATE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/payload_pieces.h"
#include "server/job/chunk_screen.h"
#include "server/job/chunk_sum.h"
#include "server/job/round_deadline.h"

namespace co2::server {

struct RoundOptions {
  size_t shard_elements = 0;  // n, this shard's range size
  uint32_t min_workers = 1;   // quorum at the deadline
  absl::Duration round_timeout = absl::Seconds(60);  // see class comment
  uint64_t first_round = 0;  // the open round at start (restored shards)
  // How the deadline adapts to observed completion times; fixed at
  // round_timeout by default (server/job/round_deadline.h).
  RoundDeadlineOptions deadline;
  // Sum contributions exactly, so that a round's mean is the same bits in
  // any order of arrival (JobConfig.deterministic); else in fp32.
  bool exact_sums = false;
  // The job's rounds (JobConfig.rounds); 0: not stated. Only a job that
  // states them closes a round without contributions, and never past the
  // last (TryClose).
  uint64_t rounds = 0;
  // k of the outlier rule (JobConfig.outlier_ratio); 0: every contribution
  // is averaged in.
  double outlier_ratio = 0;
};

struct ChunkOutcome {
  bool duplicate = false;  // already counted; nothing changed
  bool folded = false;     // a round r − 1 chunk, added to round r
};

// One chunk's mean, taken ahead of its round's close.
struct CompleteChunk {
  uint32_t chunk_index = 0;
  // Workers whose contribution completed it and is in the mean.
  uint32_t contributors = 0;
  std::vector<float> mean;
  std::vector<HeldOut> held_out;  // contributions held out of the mean
};

// A worker whose contribution to a chunk was counted, with the weight of its
// contribution to the round (sent with chunk 0; 0 while that has not come).
struct ChunkSender {
  std::string worker;
  double contribution_weight = 0;
};

struct ClosedRound {
  uint64_t round = 0;
  uint32_t contributors = 0;  // workers with a complete contribution
  double total_weight = 0;    // Σ weights of those complete contributions
  bool quorum_close = false;  // closed at the deadline, not by completeness
  // D_r, the weighted mean, chunk by chunk (mean[c] covers
  // common::ChunkRange(n, c)), each a vector of its own, so that each is
  // freed as soon as the caller is done with it.
  // Empty for the chunks taken ahead (TakeCompleteChunks).
  std::vector<std::vector<float>> mean;
  // Contributions held out of those chunks' means (outlier_ratio).
  std::vector<HeldOut> held_out;
  // The largest norm / median of a chunk of this round, taken ahead or not
  // (0 without outlier_ratio): how far the rule's k is from tripping.
  double max_norm_ratio = 0;
};

class RoundState {
 public:
  RoundState(const RoundOptions& options, common::Clock* clock);  // borrowed
  RoundState(const RoundState&) = delete;
  RoundState& operator=(const RoundState&) = delete;

  // Makes `worker` live and required for every round >= first_round. Calling
  // it again for a live worker updates first_round.
  void AddWorker(std::string_view worker, uint64_t first_round);
  // The worker left or its lease expired: no longer required. Its counted
  // chunks stay counted.
  void RemoveWorker(std::string_view worker);
  bool IsLive(std::string_view worker) const;
  size_t live_workers() const;
  // Whether a live worker has no round yet (added with first_round
  // UINT64_MAX: it takes part once it has fetched the anchor).
  bool HasWorkerWithoutRound() const;

  // Accumulates one chunk. `payload` must already have passed
  // common::Validate for the chunk's element count (see ChunkElements()).
  // NOT_FOUND for a worker that is not live; ABORTED / FAILED_PRECONDITION for
  // rounds out of the window; INVALID_ARGUMENT for a chunk index out of range,
  // a weight that is not finite or outside the sums' range
  // (ChunkSum::CheckWeight), or a value whose product with the weight does
  // not fit the round's sum (then nothing is counted).
  absl::StatusOr<ChunkOutcome> AddChunk(std::string_view worker, uint64_t round,
                                        uint32_t chunk_index,
                                        common::Codec codec,
                                        std::string_view payload,
                                        double weight);
  // The same for a payload in pieces, read in place (an int8 payload must
  // be one piece; see common/payload_pieces.h).
  absl::StatusOr<ChunkOutcome> AddChunk(std::string_view worker, uint64_t round,
                                        uint32_t chunk_index,
                                        common::Codec codec,
                                        common::Pieces payload, double weight);

  // Closes the open round if it is complete or past its deadline with quorum:
  // computes the mean, advances the open round and returns it. Otherwise
  // nothing happens and it returns nullopt. Call after AddChunk,
  // RemoveWorker, and when Deadline() passes. Closes at most one round per
  // call: call again while it returns a round (r + 1 may be complete too).
  std::optional<ClosedRound> TryClose();
  // The chunks of the open round not taken yet that every live worker
  // required for it has sent (none while no worker is required): their means,
  // handed over as Close would, in chunk order. Contributions to them that
  // arrive later go to the next round.
  std::vector<CompleteChunk> TakeCompleteChunks();

  // The workers counted in chunk `chunk_index` of the open round.
  std::vector<ChunkSender> SendersOf(uint32_t chunk_index) const;
  // For a restarted shard: chunk `chunk_index` of the open round was taken
  // ahead of its close before the restart, from `senders`. Their resends of
  // it are duplicates; others' contributions to it go to the next round.
  // Senders that are not members yet are kept as departed workers are.
  void RestoreTakenChunk(uint32_t chunk_index,
                         const std::vector<ChunkSender>& senders);

  // For a shard re-seeded after it lost its state: `round` becomes the open
  // round. Only while no chunk has been accumulated (the anchor was not
  // ready, so none was accepted).
  void Reopen(uint64_t round);

  uint64_t open_round() const;
  uint32_t num_chunks() const;
  // Elements in chunk `chunk_index` (the last may be short).
  size_t ChunkElements(uint32_t chunk_index) const;
  // When the open round's deadline passes; nullopt while it has no chunk.
  std::optional<absl::Time> Deadline() const;
  // How long the next round may wait after its first chunk (round_timeout,
  // or less once adapted).
  absl::Duration RoundTimeout() const { return deadline_rule_.Current(); }
  // Rounds whose deadline passed without quorum (counted once per round).
  uint64_t quorum_misses() const;

  // For checkpoints: which chunks of round open − 1 `worker` has had counted
  // (bit c of byte c / 8), empty if none. Restoring them lets a restarted
  // shard recognise resends of the last closed round as duplicates instead of
  // folding them into the open round a second time.
  std::string CountedInPreviousRound(std::string_view worker) const;
  // Marks those chunks as counted for `worker` (which must have been added).
  void RestoreCountedInPreviousRound(std::string_view worker,
                                     std::string_view bits);

 private:
  // Which chunks of one round a worker has sent; count() is O(1).
  class ChunkSet {
   public:
    void Reset(uint32_t num_chunks);  // sizes it, all clear
    void Clear();
    bool Test(uint32_t c) const { return (words_[c / 64] >> (c % 64)) & 1u; }
    void Set(uint32_t c);
    uint32_t count() const { return count_; }

   private:
    std::vector<uint64_t> words_;
    uint32_t count_ = 0;
  };

  // Slots of Worker::received / weight0, relative to the open round.
  static constexpr int kPrev = 0;  // open − 1 (folded late chunks)
  static constexpr int kOpen = 1;
  static constexpr int kNext = 2;  // open + 1

  struct Worker {
    bool live = false;
    uint64_t first_round = 0;
    // A round closed at its deadline without its complete contribution; not
    // required until it sends a chunk again.
    bool missed = false;
    std::array<ChunkSet, 3> received;
    // The weight sent with chunk 0: the weight of the contribution.
    std::array<double, 3> weight0 = {0, 0, 0};
  };

  // `worker`'s record, created (not live, nothing received) if it has none.
  Worker& RecordOf(std::string_view worker);
  // Accumulator slot of a round: rounds alternate between the two slots.
  static int Slot(uint64_t round) { return static_cast<int>(round & 1); }
  // The sum of chunk `chunk_index` in `slot`, made (zero) if the chunk has
  // none.
  ChunkSum& AccumulatorOf(int slot, uint32_t chunk_index);
  // acc[slot][chunk c] += w · decode(payload), now or once the chunk's
  // median is known (outlier_ratio). INVALID_ARGUMENT, with nothing added,
  // if it does not fit.
  absl::Status Accumulate(int slot, uint32_t chunk_index, common::Codec codec,
                          common::Pieces payload, float w,
                          std::string_view worker);
  // The mean of chunk `chunk_index` of `slot` (zeros if it has no weight),
  // the held contributions settled first (their hold-outs appended to
  // `held_out`); its sum is kept for reuse.
  std::vector<float> TakeMean(int slot, uint32_t chunk_index,
                              std::vector<HeldOut>* held_out);
  // Takes the means of the open round, hands them over and advances the open
  // round.
  ClosedRound Close(uint32_t contributors, double total_weight,
                    bool quorum_close);
  // Whether `w` must contribute to the open round for it to be complete.
  bool Required(const Worker& w) const {
    return w.live && w.first_round <= open_ && !w.missed;
  }
  // Recounts required_ and senders_ from the workers (membership changed, or
  // a new round opened).
  void RecountSenders();
  // Sets the open round's deadline: now + the deadline rule's current value.
  void ArmDeadline();

  const RoundOptions options_;
  common::Clock* const clock_;
  const uint32_t num_chunks_;

  uint64_t open_ = 0;
  // Σ w·Δ per element, chunk by chunk, for rounds with Slot(round) == i; a
  // chunk's is null until its first contribution, and again once its mean
  // was taken.
  std::array<std::vector<std::unique_ptr<ChunkSum>>, 2> acc_;
  // Sums of full chunks whose means were taken, for reuse: at most as many
  // as two rounds had at once.
  std::vector<std::unique_ptr<ChunkSum>> spare_;
  // The outlier rule's state per slot and chunk (sized with outlier_ratio
  // only), and each chunk's median of its last settled round.
  std::array<std::vector<ChunkScreen>, 2> screens_;
  std::vector<std::optional<double>> last_median_;
  double max_norm_ratio_ = 0;  // of the open round's settled chunks
  std::array<bool, 2> has_chunk_ = {false, false};  // a chunk of that round
  std::optional<absl::Time> deadline_;              // of the open round
  absl::Time armed_at_;  // when deadline_ was set: the round's first chunk
  RoundDeadline deadline_rule_;
  bool miss_counted_ = false;                       // for the open round
  uint64_t quorum_misses_ = 0;
  size_t live_workers_ = 0;
  // Chunks of the open round taken ahead of its close.
  ChunkSet taken_;
  // Live workers required for the open round, and per chunk how many of them
  // have sent it: a chunk is complete when the two are equal.
  uint32_t required_ = 0;
  std::vector<uint32_t> senders_;
  // Chunks that became complete since the last TakeCompleteChunks (perhaps
  // taken, or listed twice), so that it does not scan every chunk per call.
  std::vector<uint32_t> ready_;
  // Live workers, and departed ones while they still have counted chunks in
  // the window (their complete contributions count at close; a rejoin keeps
  // its duplicate detection).
  absl::flat_hash_map<std::string, Worker> workers_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_ROUND_STATE_H_
