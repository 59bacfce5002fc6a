// AnchorExchange: a worker leader's half of the round protocol, torch-free.
// It owns the anchor A (the parameters every worker starts a round from) and
// the AggregatorClient; at each round boundary it turns the live parameters
// x into Δ = A − x (in place), pushes Δ, applies the update it owes
// (A ← A + decode(U)) and writes the new anchor back into x. The C++
// optimizer (Co2Optimizer) and the Python package drive the same code, so a
// job's workers agree bit for bit whichever language they train in.
//
//   staleness 1 (co2)  push Δ_r first, then apply U of round r − 1: the
//                      update of a round arrives while the next one computes.
//   staleness 0        push Δ_r, wait for U of round r, apply it (localsgd,
//                      slowmo).
//
// Eager updates (Kale et al. 2025, "Eager Updates For Overlapped
// Communication and Computation in DiLoCo"; AnchorExchangeOptions::
// eager_share), staleness 1 only: the anchor stays the shards', but the
// worker starts round r + 1 from x = A_{r+1} + e_{r+1}, where
//   e_{r+1} = −k·share·(Δ_r − Δ_{r−1}),  k = EagerScale(config, r − 1):
// the update of round r − 1 as if its mean held this worker's fresh Δ_r in
// place of its stale Δ_{r−1}, so its own latest progress is not dropped
// for a round. Δ is then taken against the round's start point, A + e, so
// the shards' mean holds each worker's inner progress only.
//
// Carried progress (AnchorExchangeOptions::carry_progress), staleness 1,
// not with eager updates: until the update made from round r's mean is
// applied, round r + 1 runs from where this worker's own Δ_r would take the
// anchor, x = A_{r+1} − k·Δ_r (k = EagerScale(config, r)), instead of from
// A_{r+1}, which lacks every worker's round r; its own progress stands in
// for the mean's until the mean arrives. Applying that update (on arrival
// or at the boundary) replaces the stand-in: x ← x − (A + e) + A_new and
// e ← 0. Δ is taken against the start point, so the shards' mean holds
// each worker's inner progress only and A stays the shards'.
//
// Apply on arrival (ApplyArrived; docs/algorithm.md, "Applying an update
// when it arrives"), staleness 1: the update a round owes may be applied
// between its inner steps, as soon as every shard has sent it, instead of
// at the round's boundary: A ← A + U and x ← A_new + (x − s), where s is
// the round's start point (A, or A + e), so the steps already taken are
// kept. The boundary then takes Δ against the new start point, which holds
// the same progress, and applies nothing. The anchors stay the shards'.
// ApplyDue and ApplyOwed are the test and the apply a trainer calls between
// steps; with a bound (AnchorExchangeOptions::apply_by_step = L) the update
// is due from step L on even when not back yet, and is waited for there.
//
// Memory: A (P floats) and the client's send and receive buffers; with eager
// updates also e and the last Δ (2·P floats), with carried progress e.
// One thread calls everything; stats() of the client from any thread.
#ifndef CO2_CLIENT_ANCHOR_EXCHANGE_H_
#define CO2_CLIENT_ANCHOR_EXCHANGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/aggregator_client.h"
#include "common/clock.h"
#include "common/codec.h"

namespace co2::client {

// The update a worker whose next round is `round` still owes after its last
// boundary: with staleness 1, U of round − 1 when that is one of the job's
// `rounds` (0: unknown, every round counts); none with staleness 0.
std::optional<uint64_t> OwedUpdate(uint32_t staleness, uint64_t rounds,
                                   uint64_t round);

// Connects a worker again, filling the span with the shards' anchor: what
// AnchorExchangeOptions::reconnect calls to heal.
using Reconnect = std::function<absl::StatusOr<std::unique_ptr<AggregatorClient>>(
    absl::Span<float> anchor)>;

// The heal every caller makes: connect again with `options` as a rejoining
// worker (ClientOptions::rejoin, no resume_round), which fetches the
// shards' anchor (of options.owned_shards only, where set).
Reconnect RejoinWith(ClientOptions options);

struct AnchorExchangeOptions {
  // The job's rounds, 0 .. rounds − 1 (JobConfig.rounds). Required with
  // staleness 1: the update of the last round is owed after its boundary.
  uint64_t rounds = 0;
  // Samples one inner step of this worker consumes (all its local ranks); a
  // contribution weighs steps × samples_per_step.
  double samples_per_step = 1.0;
  absl::Duration update_timeout = absl::Minutes(5);  // one update's wait
  absl::Duration push_timeout = absl::Minutes(5);    // one Push
  absl::Duration leave_timeout = absl::Seconds(10);  // Leave at the end
  // The codec the client was connected with (bytes-sent accounting).
  common::Codec uplink_codec = common::Codec::kFp32;
  common::Clock* clock = common::Clock::Real();  // borrowed
  // Called every `interrupt_poll` while an update is awaited; a non-OK
  // status ends the wait with it (a Python caller checks for Ctrl-C here).
  std::function<absl::Status()> check_interrupt;
  absl::Duration interrupt_poll = absl::Milliseconds(200);
  // Heals a worker the shards cannot take back where it is (HealReasonOf):
  // connects this worker again as a rejoining one (ClientOptions::rejoin),
  // fetching the shards' anchor into the span. Null: no healing, the
  // boundary fails with the shards' reason.
  Reconnect reconnect;
  // Eager updates (above): this worker's share of a round's mean, in
  // (0, 1] (1/M for M workers of equal weight); 0: off. Needs staleness 1.
  double eager_share = 0;
  // Carried progress (above); needs staleness 1 and no eager updates.
  bool carry_progress = false;
  // Apply on arrival with a bound (docs/algorithm.md, "A bound in steps"):
  // from this inner step of a round on, the update the round owes is due
  // whether or not it has arrived, and ApplyOwed waits for it. 0: only an
  // arrived update is due. Needs staleness 1; the callers check it against
  // τ (CheckApplyBy).
  int apply_by_step = 0;
};

// ∂U/∂D of the shards' step of `round` (server/job/outer_optimizer.h) with
// the gap penalty at 1 and no clipping: α for heavy ball, α·(1 + β) for
// Nesterov, α/N or, at a momentum step, α·(1 + β)/N for delayed Nesterov;
// divided by λ for a constant penalty. The eager update's and the carried
// progress's k.
float EagerScale(const v1::JobConfig& config, uint64_t round);

// Why a failed boundary can be healed by fetching the anchor again: the
// shards moved past what they can replay to this worker ("behind", after a
// pause or a cut link), refused its contribution as stale ("stale"), or no
// longer count it as a member ("dropped", its lease expired). Null for any
// other failure.
const char* HealReasonOf(const absl::Status& status);

// What one boundary cost, added to by Boundary and Drain.
struct ExchangeTimes {
  absl::Duration exposed_comm;  // waiting for an update
  absl::Duration push;          // encoding Δ and handing it to the streams
  uint64_t bytes_sent = 0;      // payload bytes pushed
  // Anchor ranges that differed from their shard's digest when an update
  // was applied, and were fetched again.
  uint64_t anchor_mismatches = 0;
  // Set when this boundary healed: the worker rejoined at `healed_round`
  // (A and x hold that round's anchor, every update before it applied).
  std::optional<uint64_t> healed_round;
  const char* heal_reason = nullptr;  // HealReasonOf the failure healed
  absl::Duration heal_time;           // from the failure to the anchor
};

class AnchorExchange {
 public:
  // `client` is connected with `x0` (size P) as its anchor, so x0 holds A of
  // the client's start round; it is copied into A, which the client tracks
  // for re-seeding. INVALID_ARGUMENT for options that do not fit the job.
  static absl::StatusOr<std::unique_ptr<AnchorExchange>> Create(
      const AnchorExchangeOptions& options,
      std::unique_ptr<AggregatorClient> client, absl::Span<const float> x0);
  // The same, taking `x0` as A without a copy.
  static absl::StatusOr<std::unique_ptr<AnchorExchange>> Create(
      const AnchorExchangeOptions& options,
      std::unique_ptr<AggregatorClient> client, std::vector<float> x0);

  AnchorExchange(const AnchorExchange&) = delete;
  AnchorExchange& operator=(const AnchorExchange&) = delete;

  // The round the worker started at (after a heal: the round it rejoined
  // at). Like client(), not after a heal failed.
  uint64_t start_round() const { return client_->start_round(); }
  uint32_t staleness() const { return staleness_; }
  const v1::JobConfig& job_config() const { return job_config_; }
  const std::vector<float>& anchor() const { return anchor_; }
  const AggregatorClient& client() const { return *client_; }
  // The uplink's error-feedback residual (AggregatorClient::residual).
  absl::Span<const float> residual() const { return client_->residual(); }
  absl::Status RestoreResidual(absl::Span<const float> residual) {
    return client_->RestoreResidual(residual);
  }
  // The start point's state: e, the offset of the round's start from A
  // (eager updates or carried progress; empty when both are off), and with
  // eager updates the last Δ pushed (else empty). With the anchor and the
  // residual, what a worker saves to resume bit for bit.
  absl::Span<const float> start_offset() const { return start_offset_; }
  absl::Span<const float> last_delta() const { return last_delta_; }
  // The bytes of co2's state this exchange holds for its P elements.
  struct StateBytes {
    size_t anchor = 0;  // A, with the start offset and the last Δ
    // The client's send and receive buffers (encoded), with a lossy
    // uplink's error-feedback residual.
    size_t client_buffers = 0;
  };
  StateBytes state_bytes() const;
  // Replaces both after a resume (the caller starts from A + offset).
  // INVALID_ARGUMENT when both are off or a size is not what they hold (P,
  // or 0 for the last Δ of carried progress).
  absl::Status RestoreStartOffset(absl::Span<const float> offset,
                                  absl::Span<const float> last_delta);

  // The boundary of `round` after `steps` inner steps: x (size P) holds the
  // live parameters and, on success, the anchor that starts round + 1, or,
  // when the boundary healed (times.healed_round), the anchor of the round
  // it rejoined at.
  absl::Status Boundary(uint64_t round, int steps, absl::Span<float> x,
                        ExchangeTimes& times);

  // Waits for and applies U of `owed`, then x ← A (the final anchor); heals
  // as Boundary does.
  absl::Status Drain(uint64_t owed, absl::Span<float> x, ExchangeTimes& times);

  // Waits until U of `round` has arrived from every shard, without applying
  // it (timed as exposed communication): once it has, every worker's
  // contribution to `round` is in, and this worker may stop and later rejoin
  // at round + 1 (the shards replay the update).
  absl::Status AwaitUpdate(uint64_t round, ExchangeTimes& times);

  // Whether the update round `round` owes (OwedUpdate) has arrived from
  // every shard and was not applied yet: the test between inner steps (one
  // atomic load per shard while it has not). Always false with staleness 0.
  bool UpdateArrived(uint64_t round) const;
  // Applies that update now, inside round `round`: A ← A + U, and x (size P,
  // the live parameters) ← x + (A_new − A_old), so x keeps the steps taken
  // since the round's start (with carried progress x ← x − (A_old + e) +
  // A_new and e ← 0). The round's Boundary then applies nothing.
  // FAILED_PRECONDITION when UpdateArrived(round) is false. Heals as
  // Boundary does (times.healed_round: x holds that round's anchor).
  absl::Status ApplyArrived(uint64_t round, absl::Span<float> x,
                            ExchangeTimes& times);
  // The test between inner steps of a worker applying on arrival, `steps`
  // steps into round `round`: whether the update the round owes is applied
  // now. It is once it has arrived (UpdateArrived) and, from step
  // options.apply_by_step on, while it is owed and not applied yet, arrived
  // or not.
  bool ApplyDue(uint64_t round, int steps) const;
  // Applies it as ApplyDue(round, steps) decided: ApplyArrived, or, from
  // step apply_by_step on, first waits for the update as the boundary would
  // (timed as exposed communication, at most update_timeout).
  // FAILED_PRECONDITION when ApplyDue(round, steps) is false.
  absl::Status ApplyOwed(uint64_t round, int steps, absl::Span<float> x,
                         ExchangeTimes& times);

  // Heals now, whatever the last call returned: rejoins through
  // options.reconnect, A and x (size P) ← the shards' anchor, recorded in
  // `times` with `reason`, as a boundary that heals does. A node whose
  // ranks exchange their own slices heals every rank when one of them must
  // (Co2Optimizer). FAILED_PRECONDITION without options.reconnect; the
  // reconnect's error (no client is left then).
  absl::Status Rejoin(const char* reason, absl::Span<float> x,
                      ExchangeTimes& times);

  // Checks A bit for bit against the shards' anchor of `anchor_round`
  // (DATA_LOSS naming both hashes), then leaves the job (best effort).
  absl::Status VerifyAnchor(uint64_t anchor_round);
  void Leave();
  // Test seam (the fault suite, co2-train --inject_fault=W:scale_delta=...):
  // multiplies the Δ pushed in rounds first .. last by `factor`, as a worker
  // whose training diverged would send it. Only the pushed copy is scaled:
  // x, and with it the next start point and the eager state, keep the
  // worker's own Δ.
  void ScaleDeltasForTesting(float factor, uint64_t first, uint64_t last) {
    delta_scale_ = factor;
    scale_first_ = first;
    scale_last_ = last;
  }

 private:
  AnchorExchange(const AnchorExchangeOptions& options,
                 std::unique_ptr<AggregatorClient> client,
                 std::vector<float> x0);

  absl::Status Push(uint64_t round, int steps, absl::Span<float> x,
                    ExchangeTimes& times);
  // After `failed`: when it can be healed and options.reconnect is set,
  // replaces the client by a rejoining one, A and x by the shards' anchor,
  // and records it in `times`; else `failed` itself.
  absl::Status Heal(absl::Status failed, absl::Span<float> x,
                    ExchangeTimes& times);
  // Whether a step `steps` into a round is past options.apply_by_step.
  bool Bounded(int steps) const {
    return options_.apply_by_step > 0 && steps >= options_.apply_by_step;
  }
  // The update round `round` owes, when it was not applied yet, and when it
  // has also arrived from every shard (UpdateArrived).
  std::optional<uint64_t> PendingUpdate(uint64_t round) const;
  std::optional<uint64_t> ArrivedUpdate(uint64_t round) const;
  // ApplyOwed's apply of `owed`, which has arrived.
  absl::Status ApplyEarly(uint64_t owed, absl::Span<float> x,
                          ExchangeTimes& times);
  // A ← A + decode(U) of `round`, counting digest mismatches into `times`.
  absl::Status Apply(uint64_t round, ExchangeTimes& times);
  // INVALID_ARGUMENT naming `method` unless x holds the job's P parameters.
  absl::Status CheckSize(absl::string_view method,
                         absl::Span<const float> x) const;
  void CopyAnchorTo(absl::Span<float> x) const;
  // x ← the next round's start point: A, or A + e with eager updates or
  // carried progress (one pass; Push takes Δ from the same sum).
  void CopyStartTo(absl::Span<float> x) const;
  // After the push of `round` (x holds Δ_r), with eager updates or carried
  // progress: e (and the last Δ) for the next round's start.
  void TakeOffsetStep(uint64_t round, absl::Span<const float> delta);

  const AnchorExchangeOptions options_;
  std::unique_ptr<AggregatorClient> client_;
  const v1::JobConfig job_config_;
  const uint32_t staleness_;
  std::vector<float> anchor_;
  // Eager updates or carried progress: the offset e of this round's start
  // from A; eager updates only: the last Δ pushed (zeros before the first
  // and after a heal).
  std::vector<float> start_offset_;
  std::vector<float> last_delta_;
  // The owed update ApplyArrived applied before its round's boundary.
  std::optional<uint64_t> applied_early_;
  // ScaleDeltasForTesting: the factor and the rounds [first, last] it
  // applies to (none while factor is 1).
  float delta_scale_ = 1.0f;
  uint64_t scale_first_ = 0;
  uint64_t scale_last_ = 0;
};

}  // namespace co2::client

#endif  // CO2_CLIENT_ANCHOR_EXCHANGE_H_
