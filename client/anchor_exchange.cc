#include "client/anchor_exchange.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/momentum_schedule.h"
#include "common/status_macros.h"

namespace co2::client {

std::optional<uint64_t> OwedUpdate(uint32_t staleness, uint64_t rounds,
                                   uint64_t round) {
  // A_{r+1} = A_r + U of round r − 1, and round 0 has none (A_1 = A_0). A
  // worker that joined a running job fetched A_s: it owes the update of
  // round s − 1 like any other, also when s − 1 is the job's last round and
  // it computes no round itself.
  if (staleness != 1 || round == 0) return std::nullopt;
  if (rounds > 0 && round - 1 >= rounds) return std::nullopt;
  return round - 1;
}

float EagerScale(const v1::JobConfig& config, uint64_t round) {
  double scale = config.alpha();
  switch (config.momentum()) {
    case v1::MOMENTUM_NESTEROV:
      scale *= 1.0 + config.beta();
      break;
    case v1::MOMENTUM_DELAYED_NESTEROV: {
      const uint32_t period = std::max<uint32_t>(config.momentum_period(), 1);
      if (common::StepsDelayedMomentum(period, round)) {
        scale *= 1.0 + config.beta();
      }
      scale /= period;
      break;
    }
    default:
      break;
  }
  if (config.gap_penalty() == v1::GAP_PENALTY_CONSTANT) {
    scale /= config.penalty_lambda();
  }
  return static_cast<float>(scale);
}

const char* HealReasonOf(const absl::Status& status) {
  // The wording is the shards' and the stream's (round_state.cc,
  // shard_members.cc, job_shard.cc, shard_stream.cc); anchor_exchange_test
  // pins it.
  const absl::string_view message = status.message();
  switch (status.code()) {
    case absl::StatusCode::kFailedPrecondition:
      return absl::StrContains(message, "cannot follow the shard") ||
                     absl::StrContains(message, "older than the oldest update")
                 ? "behind"
                 : nullptr;
    case absl::StatusCode::kAborted:
      return absl::StrContains(message, "is stale") ? "stale" : nullptr;
    case absl::StatusCode::kNotFound:
      return absl::StrContains(message, "is not a live member") ? "dropped"
                                                                : nullptr;
    default:
      return nullptr;
  }
}

Reconnect RejoinWith(ClientOptions options) {
  options.rejoin = true;
  options.resume_round.reset();
  return [options](absl::Span<float> anchor) {
    return AggregatorClient::Connect(options, anchor);
  };
}

AnchorExchange::AnchorExchange(const AnchorExchangeOptions& options,
                               std::unique_ptr<AggregatorClient> client,
                               std::vector<float> x0)
    : options_(options),
      client_(std::move(client)),
      job_config_(client_->job_config()),
      staleness_(job_config_.max_staleness()),
      anchor_(std::move(x0)) {
  if (options_.eager_share != 0 || options_.carry_progress) {
    start_offset_.assign(anchor_.size(), 0.0f);
  }
  if (options_.eager_share != 0) last_delta_.assign(anchor_.size(), 0.0f);
}

absl::StatusOr<std::unique_ptr<AnchorExchange>> AnchorExchange::Create(
    const AnchorExchangeOptions& options,
    std::unique_ptr<AggregatorClient> client, absl::Span<const float> x0) {
  return Create(options, std::move(client),
                std::vector<float>(x0.begin(), x0.end()));
}

absl::StatusOr<std::unique_ptr<AnchorExchange>> AnchorExchange::Create(
    const AnchorExchangeOptions& options,
    std::unique_ptr<AggregatorClient> client, std::vector<float> x0) {
  if (client == nullptr) {
    return absl::InvalidArgumentError("AnchorExchange: no aggregator client");
  }
  const v1::JobConfig& config = client->job_config();
  const common::Range slice = client->slice();
  if (slice.size() != x0.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "AnchorExchange: the client exchanges ", slice.size(),
        " parameters ([", slice.begin, ", ", slice.end, ") of the job's ",
        config.num_parameters(), "), the model gives ", x0.size()));
  }
  if (config.max_staleness() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AnchorExchange: max_staleness ", config.max_staleness(),
                     " is not supported (0 or 1)"));
  }
  if (config.rounds() != 0 && config.rounds() != options.rounds) {
    return absl::InvalidArgumentError(
        absl::StrCat("AnchorExchange: rounds is ", options.rounds,
                     " but the job's JobConfig.rounds is ", config.rounds()));
  }
  if (config.max_staleness() == 1 && options.rounds == 0) {
    return absl::InvalidArgumentError(
        "AnchorExchange: a one-round-stale job needs rounds (the job's number "
        "of rounds) > 0");
  }
  if (options.eager_share != 0 &&
      (config.max_staleness() != 1 ||
       !(options.eager_share > 0 && options.eager_share <= 1))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AnchorExchange: eager updates need a one-round-stale job (co2) and "
        "a share in (0, 1]; the job has max_staleness ",
        config.max_staleness(), ", the share is ", options.eager_share));
  }
  if (options.carry_progress &&
      (config.max_staleness() != 1 || options.eager_share != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AnchorExchange: carried progress needs a one-round-stale job (co2) "
        "without eager updates; the job has max_staleness ",
        config.max_staleness(), ", the eager share is ", options.eager_share));
  }
  if (options.apply_by_step < 0 ||
      (options.apply_by_step > 0 && config.max_staleness() != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AnchorExchange: apply_by_step is ", options.apply_by_step,
        "; it bounds when an update applied on arrival is applied, so it "
        "needs a one-round-stale job (co2) and a step >= 1 (0: no bound); "
        "the job has max_staleness ",
        config.max_staleness()));
  }
  if (!(options.samples_per_step > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AnchorExchange: samples_per_step must be > 0, got ",
                     options.samples_per_step));
  }
  std::unique_ptr<AnchorExchange> exchange(
      new AnchorExchange(options, std::move(client), std::move(x0)));
  // A shard that loses the job's state is re-seeded from this anchor.
  CO2_RETURN_IF_ERROR(exchange->client_->TrackAnchor(exchange->anchor_));
  return exchange;
}

absl::Status AnchorExchange::Push(uint64_t round, int steps,
                                  absl::Span<float> x, ExchangeTimes& times) {
  // Δ = A − x (with eager updates or carried progress A + e − x, from where
  // the round started), in place: x is overwritten with the next start
  // point right after.
  const float* a = anchor_.data();
  float* d = x.data();
  if (start_offset_.empty()) {
    for (size_t i = 0; i < x.size(); ++i) d[i] = a[i] - d[i];
  } else {
    const float* e = start_offset_.data();
    for (size_t i = 0; i < x.size(); ++i) d[i] = (a[i] + e[i]) - d[i];
  }
  const double weight = steps * options_.samples_per_step;
  const absl::Time pushed = options_.clock->Now();
  // ScaleDeltasForTesting scales a copy: x itself stays Δ.
  std::vector<float> scaled;
  if (delta_scale_ != 1.0f && round >= scale_first_ && round <= scale_last_) {
    scaled.assign(x.begin(), x.end());
    for (float& v : scaled) v *= delta_scale_;
  }
  const absl::Span<const float> pushing =
      scaled.empty() ? absl::Span<const float>(x) : absl::MakeConstSpan(scaled);
  CO2_RETURN_IF_ERROR(client_->Push(round, pushing, weight,
                                    pushed + options_.push_timeout));
  times.push += options_.clock->Now() - pushed;
  times.bytes_sent += common::EncodedSize(options_.uplink_codec, x.size());
  return absl::OkStatus();
}

absl::Status AnchorExchange::AwaitUpdate(uint64_t round,
                                         ExchangeTimes& times) {
  const absl::Time t = options_.clock->Now();
  const absl::Time deadline = t + options_.update_timeout;
  absl::Status waited;
  while (true) {
    const absl::Time slice =
        options_.check_interrupt
            ? std::min(deadline,
                       options_.clock->Now() + options_.interrupt_poll)
            : deadline;
    waited = client_->WaitForUpdate(round, slice);
    if (waited.code() != absl::StatusCode::kDeadlineExceeded ||
        slice >= deadline) {
      break;
    }
    waited = options_.check_interrupt();
    if (!waited.ok()) break;
  }
  times.exposed_comm += options_.clock->Now() - t;
  if (!waited.ok()) {
    return absl::Status(waited.code(),
                        absl::StrCat("waiting for the update of round ", round,
                                     ": ", waited.message()));
  }
  return absl::OkStatus();
}

absl::Status AnchorExchange::Apply(uint64_t round, ExchangeTimes& times) {
  const uint64_t before = client_->stats().anchor_mismatches;
  const absl::Status applied =
      client_->ApplyUpdate(round, absl::MakeSpan(anchor_)).status();
  times.anchor_mismatches += client_->stats().anchor_mismatches - before;
  return applied;
}

absl::Status AnchorExchange::CheckSize(absl::string_view method,
                                     absl::Span<const float> x) const {
  if (x.size() == anchor_.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("AnchorExchange::", method, ": ", x.size(),
                   " parameters, the exchange holds ", anchor_.size()));
}

void AnchorExchange::CopyAnchorTo(absl::Span<float> x) const {
  std::memcpy(x.data(), anchor_.data(), anchor_.size() * sizeof(float));
}

void AnchorExchange::CopyStartTo(absl::Span<float> x) const {
  if (start_offset_.empty()) return CopyAnchorTo(x);
  const float* a = anchor_.data();
  const float* e = start_offset_.data();
  for (size_t i = 0; i < x.size(); ++i) x[i] = a[i] + e[i];
}

AnchorExchange::StateBytes AnchorExchange::state_bytes() const {
  const size_t p = anchor_.size();
  StateBytes bytes;
  bytes.anchor =
      (p + start_offset_.size() + last_delta_.size()) * sizeof(float);
  const absl::StatusOr<common::Codec> downlink =
      common::CodecFromWire(job_config_.downlink_codec());
  bytes.client_buffers =
      common::EncodedSize(options_.uplink_codec, p) +
      common::EncodedSize(downlink.ok() ? *downlink : common::Codec::kFp32, p);
  if (options_.uplink_codec != common::Codec::kFp32) {
    bytes.client_buffers += p * sizeof(float);
  }
  return bytes;
}

absl::Status AnchorExchange::RestoreStartOffset(
    absl::Span<const float> offset, absl::Span<const float> last_delta) {
  if (start_offset_.empty()) {
    return absl::InvalidArgumentError(
        "AnchorExchange::RestoreStartOffset: eager updates and carried "
        "progress are off");
  }
  if (offset.size() != start_offset_.size() ||
      last_delta.size() != last_delta_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AnchorExchange::RestoreStartOffset: ", offset.size(), " and ",
        last_delta.size(), " elements, this worker holds ",
        start_offset_.size(), " and ", last_delta_.size()));
  }
  start_offset_.assign(offset.begin(), offset.end());
  last_delta_.assign(last_delta.begin(), last_delta.end());
  return absl::OkStatus();
}

void AnchorExchange::TakeOffsetStep(uint64_t round,
                                    absl::Span<const float> delta) {
  float* e = start_offset_.data();
  if (options_.carry_progress) {
    // Δ_r stands in for round r's mean until the update made from it is
    // applied.
    const float k = EagerScale(job_config_, round);
    for (size_t i = 0; i < delta.size(); ++i) e[i] = -k * delta[i];
    return;
  }
  // The step Δ_r replaces Δ_{r−1} in is that of round r − 1 (round 0 has
  // none before it: its own).
  const float k = EagerScale(job_config_, round == 0 ? 0 : round - 1) *
                  static_cast<float>(options_.eager_share);
  float* last = last_delta_.data();
  for (size_t i = 0; i < delta.size(); ++i) {
    e[i] = -k * (delta[i] - last[i]);
    last[i] = delta[i];
  }
}

absl::Status AnchorExchange::Boundary(uint64_t round, int steps,
                                      absl::Span<float> x,
                                      ExchangeTimes& times) {
  CO2_RETURN_IF_ERROR(CheckSize("Boundary", x));
  if (options_.rounds > 0 && round >= options_.rounds) {
    return absl::FailedPreconditionError(
        absl::StrCat("AnchorExchange: round ", round,
                     " is past the job's last round ", options_.rounds - 1));
  }
  absl::Status status;
  if (staleness_ == 1) {
    // U of round r−1 normally arrived while this round computed. Δ_r is taken
    // against A_r, so the update is applied only after the push; when
    // ApplyArrived applied it already, Δ_r is taken against A_{r+1}, which x
    // moved with.
    std::optional<uint64_t> owed =
        OwedUpdate(staleness_, options_.rounds, round);
    if (owed && applied_early_ == owed) owed.reset();
    if (owed) status = AwaitUpdate(*owed, times);
    if (status.ok()) status = Push(round, steps, x, times);
    if (owed && status.ok()) status = Apply(*owed, times);
    if (status.ok() && !start_offset_.empty()) TakeOffsetStep(round, x);
  } else {
    status = Push(round, steps, x, times);
    if (status.ok()) status = AwaitUpdate(round, times);
    if (status.ok()) status = Apply(round, times);
  }
  if (!status.ok()) return Heal(std::move(status), x, times);
  CopyStartTo(x);
  return absl::OkStatus();
}

std::optional<uint64_t> AnchorExchange::PendingUpdate(uint64_t round) const {
  const std::optional<uint64_t> owed =
      OwedUpdate(staleness_, options_.rounds, round);
  if (!owed || applied_early_ == owed || client_ == nullptr) {
    return std::nullopt;
  }
  return owed;
}

std::optional<uint64_t> AnchorExchange::ArrivedUpdate(uint64_t round) const {
  const std::optional<uint64_t> owed = PendingUpdate(round);
  if (!owed || !client_->UpdateReady(*owed)) return std::nullopt;
  return owed;
}

bool AnchorExchange::UpdateArrived(uint64_t round) const {
  return ArrivedUpdate(round).has_value();
}

bool AnchorExchange::ApplyDue(uint64_t round, int steps) const {
  return Bounded(steps) ? PendingUpdate(round).has_value()
                        : UpdateArrived(round);
}

absl::Status AnchorExchange::ApplyArrived(uint64_t round, absl::Span<float> x,
                                          ExchangeTimes& times) {
  CO2_RETURN_IF_ERROR(CheckSize("ApplyArrived", x));
  const std::optional<uint64_t> owed = ArrivedUpdate(round);
  if (!owed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "AnchorExchange::ApplyArrived: round ", round,
        " has no arrived update left to apply"));
  }
  return ApplyEarly(*owed, x, times);
}

absl::Status AnchorExchange::ApplyOwed(uint64_t round, int steps,
                                       absl::Span<float> x,
                                       ExchangeTimes& times) {
  if (!Bounded(steps)) return ApplyArrived(round, x, times);
  CO2_RETURN_IF_ERROR(CheckSize("ApplyOwed", x));
  const std::optional<uint64_t> owed = PendingUpdate(round);
  if (!owed) {
    return absl::FailedPreconditionError(
        absl::StrCat("AnchorExchange::ApplyOwed: round ", round,
                     " has no update left to apply"));
  }
  absl::Status waited = AwaitUpdate(*owed, times);
  if (!waited.ok()) return Heal(std::move(waited), x, times);
  return ApplyEarly(*owed, x, times);
}

absl::Status AnchorExchange::ApplyEarly(uint64_t owed, absl::Span<float> x,
                                        ExchangeTimes& times) {
  // x − s is the progress since the round's start; the start moves with A
  // (with eager updates s = A + e, and e stays), so x ← (x − A) + A_new.
  // Carried progress stood in for this update: s = A + e, and e ← 0.
  float* d = x.data();
  const float* a = anchor_.data();
  if (options_.carry_progress) {
    float* e = start_offset_.data();
    for (size_t i = 0; i < x.size(); ++i) {
      d[i] -= a[i] + e[i];
      e[i] = 0.0f;
    }
  } else {
    for (size_t i = 0; i < x.size(); ++i) d[i] -= a[i];
  }
  absl::Status status = Apply(owed, times);
  if (!status.ok()) return Heal(std::move(status), x, times);
  for (size_t i = 0; i < x.size(); ++i) d[i] += a[i];
  applied_early_ = owed;
  return absl::OkStatus();
}

absl::Status AnchorExchange::Drain(uint64_t owed, absl::Span<float> x,
                                   ExchangeTimes& times) {
  CO2_RETURN_IF_ERROR(CheckSize("Drain", x));
  absl::Status status;
  if (applied_early_ != owed) {
    status = AwaitUpdate(owed, times);
    if (status.ok()) status = Apply(owed, times);
  }
  if (!status.ok()) return Heal(std::move(status), x, times);
  CopyAnchorTo(x);
  return absl::OkStatus();
}

absl::Status AnchorExchange::Heal(absl::Status failed, absl::Span<float> x,
                                  ExchangeTimes& times) {
  const char* reason = HealReasonOf(failed);
  if (reason == nullptr || !options_.reconnect) return failed;
  CO2_LOG(WARNING) << "the shards cannot take this worker back where it is ("
                   << reason << ": " << failed.message()
                   << "); fetching their anchor to continue at their round";
  absl::Status rejoined = Rejoin(reason, x, times);
  if (rejoined.ok()) return rejoined;
  return absl::Status(failed.code(),
                      absl::StrCat(failed.message(),
                                   "; healing by fetching the anchor "
                                   "failed too: ",
                                   rejoined.ToString()));
}

absl::Status AnchorExchange::Rejoin(const char* reason, absl::Span<float> x,
                                    ExchangeTimes& times) {
  CO2_RETURN_IF_ERROR(CheckSize("Rejoin", x));
  if (!options_.reconnect) {
    return absl::FailedPreconditionError(
        "AnchorExchange::Rejoin: no reconnect was given");
  }
  const absl::Time start = options_.clock->Now();
  // The old client's streams end before the new one joins under the same
  // worker id.
  client_.reset();
  CO2_ASSIGN_OR_RETURN(client_, options_.reconnect(absl::MakeSpan(anchor_)));
  CO2_RETURN_IF_ERROR(client_->TrackAnchor(anchor_));
  CopyAnchorTo(x);
  // The rejoined worker starts from the shards' anchor, with no Δ before
  // and every update before its round applied.
  std::fill(start_offset_.begin(), start_offset_.end(), 0.0f);
  std::fill(last_delta_.begin(), last_delta_.end(), 0.0f);
  applied_early_.reset();
  times.healed_round = client_->start_round();
  times.heal_reason = reason;
  times.heal_time = options_.clock->Now() - start;
  CO2_LOG(WARNING) << "healed (" << reason << ") in "
                   << absl::FormatDuration(times.heal_time)
                   << ": continuing at round " << *times.healed_round
                   << " with the shards' anchor";
  return absl::OkStatus();
}

absl::Status AnchorExchange::VerifyAnchor(uint64_t anchor_round) {
  absl::Status status = client_->VerifyAnchor(
      anchor_, anchor_round, options_.clock->Now() + options_.update_timeout);
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("the final anchor (round ", anchor_round,
                                   ") is not the shards': ", status.message()));
}

void AnchorExchange::Leave() {
  // Best effort: every update this worker needs has arrived already. No
  // client is left after a heal that failed.
  if (client_ == nullptr) return;
  client_->Leave(options_.clock->Now() + options_.leave_timeout).IgnoreError();
}

}  // namespace co2::client
