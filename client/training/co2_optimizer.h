// Co2Optimizer: wraps any LibTorch optimizer (AdamW, SGD, ...) so that the
// process trains as one local rank of one worker of a CO2 job
// (docs/algorithm.md), or of one of the baselines run by the same code:
//   co2       τ inner steps, then push Δ = A − x without waiting for its
//             average; apply the one-round-stale update U (waiting only if it
//             has not arrived, and recording the wait); x ← A.
//   localsgd  τ inner steps, then a blocking average through the aggregator
//             (staleness 0, α = 1, β = 0).
//   slowmo    as localsgd, with outer momentum (β > 0) on the aggregator.
//   diloco    as slowmo, with Nesterov outer momentum (client/algo.h).
//   ddp       every step, the gradients are all-reduced across all ranks of
//             all workers (a group spanning the job); no aggregator.
// Every step (all algorithms) first averages the flat gradients inside the
// node. Who talks to the aggregator:
//   leader only  the local leader (local rank 0) exchanges the whole model
//                and broadcasts the new anchor to its local ranks after each
//                boundary.
//   rank slices  every local rank k of L exchanges its own slice of the
//                model, the shards common::OwnedShards(S, L, k) serve, over
//                its own client, under the node's one worker identity; after
//                each boundary every rank broadcasts its slice, so all hold
//                the whole model. The shards compute what the leader-only
//                exchange makes them compute, bit for bit; co2's state and
//                traffic per rank fall as 1/L. The ranks agree on every
//                decision the leader made alone: the start round, that the
//                owed update arrived, a heal (any rank's heals the node, and
//                all end on one round or the boundary fails), the final
//                check (any rank's failure fails all).
//
// Memory: the live parameters and their gradients (FlatParams), one anchor
// copy (leader only, or each rank's slice), the inner optimizer's state,
// and in the AggregatorClient one encoded send buffer and one receive
// buffer (of the slice). Δ is computed in place in the live parameters,
// which x ← A overwrites right after. Memory() reports every one of these.
//
// Owns the AggregatorClient; borrows the FlatParams, the inner optimizer and
// the groups, which must outlive it. One training thread calls everything.
#ifndef CO2_CLIENT_TRAINING_CO2_OPTIMIZER_H_
#define CO2_CLIENT_TRAINING_CO2_OPTIMIZER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/aggregator_client.h"
#include "client/algo.h"
#include "client/anchor_exchange.h"
#include "client/collectives/process_group.h"
#include "client/training/flat_params.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/layout.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace co2::client {

// What a worker's local leader (with rank slices: every local rank) saves to
// resume bit for bit after every process of the job stopped (a preemption):
// the state at the boundary of `round` once the update of round − 1 has
// arrived (so every contribution before this round's is in on the shards)
// and before this round's Δ is pushed. The inner optimizer's state goes with
// it (the caller saves it: it is the state after this round's steps).
struct WorkerCheckpoint {
  uint64_t round = 0;  // its τ inner steps are done, its Δ not pushed
  uint64_t steps = 0;  // inner steps of this worker so far
  // The part of the model the vectors below hold: [0, P) from the leader
  // alone, the rank's slice with rank slices, taken with `local_ranks` ranks
  // over `shards` shards (0: not recorded). A resume with rank slices needs
  // the same three.
  common::Range slice;
  uint32_t local_ranks = 0;
  uint32_t shards = 0;
  std::vector<float> params;        // x after the round's steps, its slice
  std::vector<float> anchor;        // A_round
  std::vector<float> residual;      // the uplink's; empty for fp32
  // The start point's state (AnchorExchange::start_offset, last_delta):
  // empty when eager updates and carried progress are off.
  std::vector<float> start_offset;
  std::vector<float> last_delta;
};

struct Co2OptimizerOptions {
  Algo algo = Algo::kCo2;
  // Inner steps per round. For ddp it only groups steps into rounds for stats.
  int tau = 8;
  // The job's rounds, 0 .. rounds − 1, the same on every worker. Required
  // for co2: the update of the last round arrives after its boundary, and
  // Finish applies it whenever this worker owes it, also when the worker
  // joined so late that it computes no round itself. 0 (unknown) is allowed
  // for the synchronous algorithms. Step refuses a round past the last.
  uint64_t rounds = 0;
  // Samples one inner step of this worker consumes (all local ranks); the
  // weight of a contribution is steps × samples_per_step.
  double samples_per_step = 1.0;
  // Deadline of one WaitForUpdate (how long a late update may take).
  absl::Duration update_timeout = absl::Minutes(5);
  // Deadline of one Push (it first waits for the previous round's update).
  absl::Duration push_timeout = absl::Minutes(5);
  // Deadline of the Leave at the end of Finish.
  absl::Duration leave_timeout = absl::Seconds(10);
  // Uplink codec the client was connected with (for the memory report only).
  common::Codec uplink_codec = common::Codec::kFp32;
  // Record a hash of the parameters after every boundary (test/diagnostics).
  bool hash_params = false;
  // Finish checks the final anchor against the shards' before it leaves
  // (AggregatorClient::VerifyAnchor: P·4 bytes down on the local leader).
  bool verify_final_anchor = true;
  // Heals the local leader when the shards cannot take it back where it is
  // (AnchorExchangeOptions::reconnect, client/anchor_exchange.h): it
  // rejoins, fetches the shards' anchor and continues at their round in
  // this process, its inner optimizer state kept; round() jumps there, on
  // every local rank. Null: the boundary fails instead.
  Reconnect reconnect;
  // Eager updates (co2 only; AnchorExchangeOptions::eager_share,
  // client/anchor_exchange.h): this worker's share of a round's mean, e.g.
  // 1/M for M workers; 0: off.
  double eager_share = 0;
  // Carried progress (co2 only, not with eager updates;
  // AnchorExchangeOptions::carry_progress): until a round's update is
  // applied, the next round runs from where this worker's own Δ would take
  // the anchor. Unset: DefaultCarryProgress (client/algo.h), on for co2
  // without eager updates, as co2-train and co2.Optimizer pick it.
  std::optional<bool> carry_progress;
  // co2 only: when the update a round owes is applied (client/algo.h).
  // Unset: DefaultApplyAt, kArrival unless the job is deterministic, as
  // co2-train and co2.Optimizer pick it; the local leader decides from its
  // job's config and the other local ranks take its choice. With kArrival
  // the local leader tests for it after every inner step but the round's
  // last and applies it there (AnchorExchange::ApplyDue, ApplyOwed); with
  // several local ranks it broadcasts its decision every step, so that all
  // apply it at the same step. A round whose boundary saves a checkpoint
  // applies it at the boundary.
  std::optional<ApplyAt> apply;
  // kArrival: the inner step of a round by which the owed update is applied
  // at the latest; a leader whose update has not arrived by then waits for
  // it there (AnchorExchangeOptions::apply_by_step), as the boundary would.
  // 0: only the boundary waits. At most tau − 1.
  int apply_by_step = 0;
  // Aggregator algorithms: every `checkpoint_every` rounds (0: never) the
  // local leader (with rank slices: every rank, each its slice's, all of
  // them or none) passes a WorkerCheckpoint to `save_checkpoint` (a failure
  // on any rank fails the boundary). With co2 it first waits for the previous round's
  // update, which has normally arrived already. Every round (1) when all
  // workers may stop at once: the shards replay two rounds of updates and
  // are then at most one round past any worker's checkpoint; from an older
  // one the worker is behind them and can only heal (fetch their anchor).
  int checkpoint_every = 0;
  std::function<absl::Status(const WorkerCheckpoint&)> save_checkpoint;
  // Resumes from a WorkerCheckpoint (borrowed until Create returns; on every
  // local rank, which share the leader's inner optimizer state; with rank
  // slices each rank's own, all of one round): the leader's (every rank's)
  // client joined with resume_round = resume->round and the saved anchor.
  // Create restores x, the residual and the start offset and completes the
  // boundary the checkpoint was taken at; round() is the next one.
  const WorkerCheckpoint* resume = nullptr;
  common::Clock* clock = common::Clock::Real();  // borrowed
};

// One round of this process, recorded at its boundary.
struct RoundStats {
  uint64_t round = 0;
  int steps = 0;                  // inner steps in the round
  absl::Duration compute;         // step() time: collectives + inner steps
  absl::Duration exposed_comm;    // WaitForUpdate (ddp: global all-reduce)
  absl::Duration push;            // Push: encode Δ, hand it to the streams
  absl::Duration boundary;        // the whole boundary
  uint64_t bytes_sent = 0;        // payload bytes pushed this round
  // Anchor ranges that differed from their shard's digest when this
  // boundary applied an update, and were fetched again.
  uint64_t anchor_mismatches = 0;
  // ApplyAt::kArrival: the inner steps of this round done when its owed
  // update was applied; 0 when it was applied at the boundary (or none).
  int applied_after_steps = 0;
  // This boundary healed (Co2OptimizerOptions::reconnect): the round it
  // moved this rank to and, on the local leader, why (HealReasonOf) and how
  // long from the failure to the shards' anchor.
  std::optional<uint64_t> healed_to;
  const char* heal_reason = nullptr;
  absl::Duration heal_time;
  // After the boundary, if hash_params: of the live parameters, or with
  // eager updates or carried progress of the anchor (what every rank
  // shares: each worker's parameters are the anchor plus its own offset).
  uint64_t params_hash = 0;
};

// Bytes held by this process for the model, by buffer.
struct MemoryReport {
  size_t params = 0;           // live parameters (flat)
  size_t grads = 0;            // gradients (flat)
  // Anchor copy (leader of the aggregator algorithms); with eager updates
  // also their offset and last Δ, with carried progress the offset.
  size_t anchor = 0;
  size_t staging = 0;          // host staging for device parameters
  size_t optimizer_state = 0;  // inner optimizer state tensors
  size_t client_buffers = 0;   // AggregatorClient send + receive (+ residual)
  size_t Total() const {
    return params + grads + anchor + staging + optimizer_state +
           client_buffers;
  }
};

class Co2Optimizer {
 public:
  // `flat` holds the re-homed parameters that `inner` optimizes. On the local
  // leader of co2/localsgd/slowmo, `client` is connected with
  // flat->ParamSpan() as its anchor (so x already holds A_0); elsewhere it is
  // null. For rank slices, every local rank's `client` owns that rank's
  // shards (ClientOptions::owned_shards = common::OwnedShards(S, L, rank))
  // and is connected with its slice of flat->ParamSpan(); the slices must
  // tile the model in rank order. `local` spans the node's local ranks
  // (null when there is one);
  // `global` spans every rank of the job and is required for ddp. Create
  // broadcasts x from the leader so every local rank starts from A_0.
  static absl::StatusOr<std::unique_ptr<Co2Optimizer>> Create(
      const Co2OptimizerOptions& options, FlatParams* flat,
      torch::optim::Optimizer* inner, std::unique_ptr<AggregatorClient> client,
      ProcessGroup* local, ProcessGroup* global);
  ~Co2Optimizer();

  Co2Optimizer(const Co2Optimizer&) = delete;
  Co2Optimizer& operator=(const Co2Optimizer&) = delete;

  // After backward(): averages gradients, runs the inner step, and on every
  // τ-th call the round boundary. An error leaves the optimizer unusable.
  absl::Status Step();
  // Drains: a partial round is closed with a boundary; for co2 the update of
  // the last round is waited for and applied, so the final model is the final
  // anchor on every rank; with verify_final_anchor the leader checks it
  // against the shards' (DATA_LOSS naming both hashes if they differ); then
  // the leader leaves the job.
  absl::Status Finish();
  // Asks to leave the job at the next boundary, before its last round (a job
  // that shrinks; co2-train calls it on SIGTERM). Any thread may call it;
  // only the local leader's call counts, and its node's ranks learn it with
  // that boundary. There every rank waits for the update of the round it
  // contributed to last (so its Δ is counted, and x is that anchor), the
  // leader leaves every shard, and left() turns true: the optimizer is
  // finished (Finish does nothing more, Step is FAILED_PRECONDITION).
  // Ignored by ddp, whose group cannot shrink, and after the last boundary.
  void RequestLeave() { leave_requested_ = true; }
  bool left() const { return left_; }

  // Zeroes the flat gradients (use instead of the inner zero_grad).
  void ZeroGrad();

  bool is_leader() const { return leader_; }
  // Whether every local rank exchanges its own slice, and this rank's
  // ([0, P) for the leader alone).
  bool rank_slices() const { return !slices_.empty(); }
  common::Range slice() const { return slice_; }
  // The choices Create made where the options left them unset.
  ApplyAt apply() const { return apply_; }
  bool carry_progress() const { return carry_progress_; }
  uint64_t round() const { return round_; }  // the round being computed
  // The round of the anchor the parameters were last set to (A_r starts
  // round r; after Finish of co2 it is the last round + 2).
  uint64_t anchor_round() const { return anchor_round_; }
  // Runs `evaluate` on the model the workers agree on: with eager updates or
  // carried progress, on the local leader of an aggregator algorithm, with
  // the parameters set to the anchor for its duration (x is restored after);
  // elsewhere on the parameters as they are. Between steps only.
  absl::Status EvaluateAtAnchor(absl::FunctionRef<absl::Status()> evaluate);
  uint64_t steps() const { return steps_; }
  const std::vector<RoundStats>& rounds() const { return rounds_; }
  absl::Duration total_exposed_comm() const;
  absl::Duration total_compute() const;
  uint64_t bytes_sent() const;
  MemoryReport Memory() const;
  // FNV-1a over the bytes of the live parameters (common/fnv_hash.h).
  uint64_t ParamsHash() const;
  // Test seam: the local leader waits (update_timeout) until the update the
  // current round owes has arrived, without applying it, so that the next
  // Step's ApplyAt::kArrival test finds it there. OK on other ranks.
  absl::Status AwaitOwedUpdateForTesting();
  // Test seam: AnchorExchange::ScaleDeltasForTesting on the local leader
  // (nothing on other ranks and with DDP).
  void ScaleDeltasForTesting(float factor, uint64_t first, uint64_t last) {
    if (exchange_ != nullptr) exchange_->ScaleDeltasForTesting(factor, first, last);
  }

 private:
  Co2Optimizer(const Co2OptimizerOptions& options, FlatParams* flat,
               torch::optim::Optimizer* inner,
               std::unique_ptr<AggregatorClient> client, ProcessGroup* local,
               ProcessGroup* global);

  absl::Status Init();
  absl::Status Boundary();
  // Finish, or with `leaving` the end of RequestLeave: no owed update past
  // the round this worker computed last, no final check against the shards
  // (their anchor moves on).
  absl::Status End(bool leaving);
  // The leader's exchange of the round's boundary (or, with `owed`, the
  // drain of that update), through the host copy of x when x lives on a
  // device; then x is broadcast to the local ranks, with the round the leader
  // healed to, if it did, into every local rank's stats.healed_to, and
  // whether it leaves now, into leave_now_.
  absl::Status ExchangeAndBroadcast(
      absl::FunctionRef<absl::Status(absl::Span<float>, ExchangeTimes&)>
          exchange,
      RoundStats& stats);
  // ApplyAt::kArrival, after an inner step that does not end the round: the
  // leader applies the round's owed update if it has arrived, and its local
  // ranks take x from it at the same step.
  absl::Status ApplyIfArrived();
  // Ends the round in `stats` (its boundary done, or a heal): records it and
  // moves to the next round, or to the one the leader healed to.
  absl::Status EndRound(RoundStats stats);
  // A WorkerCheckpoint is saved at this round's boundary (by the local
  // leader; with rank slices by every rank).
  bool CheckpointDue() const;
  // With eager updates or carried progress each worker's parameters are its
  // own offset from the anchor the ranks and workers share.
  bool OffsetFromAnchor() const {
    return options_.eager_share != 0 || carry_progress_;
  }
  // x <- `host` (all of x, on the host), wherever x lives. Throws what
  // LibTorch throws.
  void SetParams(absl::Span<const float> host);
  // This rank's slice of x on the host (a view, or the staging copy where x
  // lives on a device), and back; the whole of x for the leader alone.
  // Throw what LibTorch throws.
  absl::Span<float> HostSlice();
  void SetSlice(absl::Span<const float> host);
  // Init's part that learns every local rank's slice (slices_) and checks
  // that either the leader alone or every rank holds a client, and that
  // the ranks resume from checkpoints of one round.
  absl::Status LearnSlices();
  // Rank slices: `status` on every rank once all ended with OK, else the
  // failure (ABORTED naming the failed rank on the others).
  absl::Status AgreeOnStatus(absl::Status status);
  // Rank slices, after this rank's exchange ended with `status` (stats holds
  // its heal, if any): every rank learns how every other's ended. Any
  // failure fails every rank (ABORTED naming the rank on the others); when
  // any rank healed, the others rejoin too (AnchorExchange::Rejoin) until
  // all hold the anchor of one round, which stats.healed_to holds on every
  // rank. `x` is this rank's slice.
  absl::Status AgreeOnOutcome(absl::Status status, absl::Span<float> x,
                              RoundStats& stats);
  // Every rank's x ← every rank's slice of it (ShareSlices), or the
  // leader's whole x.
  absl::Status BroadcastParams();
  // model[slice k] ← rank k's, for every rank's slice (one broadcast per
  // rank): a model-sized host buffer of which each rank filled its slice.
  absl::Status ShareSlices(float* model);
  // The whole anchor on every rank, gathered from the ranks' slices.
  absl::StatusOr<std::vector<float>> GatherAnchor();
  // RoundStats::params_hash of a boundary.
  absl::StatusOr<uint64_t> BoundaryHash();
  // The leader's (every rank's) WorkerCheckpoint at this boundary, when one
  // is due.
  absl::Status SaveCheckpoint(RoundStats& stats);
  // Init's part on local ranks other than the leader: they take its start
  // round and apply mode.
  absl::Status FollowLeadersStart();
  // Init's part for options_.resume.
  absl::Status RestoreCheckpoint();
  // FAILED_PRECONDITION naming both layouts when `c` is not of this rank's
  // slice (with rank slices: of another L, S or slice).
  absl::Status CheckCheckpointFits(const WorkerCheckpoint& c);

  const Co2OptimizerOptions options_;
  ApplyAt apply_ = ApplyAt::kBoundary;  // options_.apply, or its default
  bool carry_progress_ = false;         // options_.carry_progress, or its default
  FlatParams* const flat_;
  torch::optim::Optimizer* const inner_;
  std::unique_ptr<AggregatorClient> client_;  // until Init hands it over
  std::unique_ptr<AnchorExchange> exchange_;  // leader, aggregator algorithms
  ProcessGroup* const local_;
  ProcessGroup* const global_;
  const bool leader_;
  const bool uses_aggregator_;
  // Rank slices: every local rank's slice, in rank order (empty for the
  // leader alone), and this rank's.
  std::vector<common::Range> slices_;
  common::Range slice_;

  std::vector<float> staging_;  // host copy of x when x lives on a device
  uint64_t start_round_ = 0;
  uint64_t round_ = 0;
  uint64_t anchor_round_ = 0;  // every rank: the anchor x was last set to
  uint64_t steps_ = 0;
  int steps_in_round_ = 0;
  bool broken_ = false;
  bool finished_ = false;
  std::atomic<bool> leave_requested_{false};
  bool leave_now_ = false;  // every rank: the leader leaves at this boundary
  bool left_ = false;
  bool resuming_ = false;  // the boundary a WorkerCheckpoint was taken at
  bool applied_this_round_ = false;  // ApplyAt::kArrival: the owed update
  RoundStats current_;
  std::vector<RoundStats> rounds_;
};

}  // namespace co2::client

#endif  // CO2_CLIENT_TRAINING_CO2_OPTIMIZER_H_
