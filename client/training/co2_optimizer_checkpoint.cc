// Co2Optimizer's checkpoint side: when a worker checkpoint is due, what it
// holds (Co2OptimizerOptions::save_checkpoint), and how a worker resumes
// from one (Co2OptimizerOptions::resume). The rest of the class is in
// co2_optimizer.cc.
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "client/training/co2_optimizer.h"
#include "client/training/torch_status.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace co2::client {

bool Co2Optimizer::CheckpointDue() const {
  return exchange_ != nullptr && options_.checkpoint_every > 0 &&
         options_.save_checkpoint && !resuming_ &&
         (round_ + 1) % options_.checkpoint_every == 0;
}

absl::Status Co2Optimizer::SaveCheckpoint(RoundStats& stats) {
  if (!CheckpointDue()) return absl::OkStatus();
  // Once the previous round's update is here, every contribution before
  // this round's is in on the shards: a resume needs only this round's Δ.
  const std::optional<uint64_t> owed =
      OwedUpdate(exchange_->staleness(), options_.rounds, round_);
  absl::Status awaited = absl::OkStatus();
  if (owed) {
    ExchangeTimes times;
    awaited = exchange_->AwaitUpdate(*owed, times);
    stats.exposed_comm += times.exposed_comm;
  }
  // With rank slices the node's checkpoints are of one round: all or none.
  if (rank_slices()) awaited = AgreeOnStatus(std::move(awaited));
  if (!awaited.ok()) {
    // The boundary meets the same failure and heals or fails with it.
    CO2_LOG(WARNING) << "no checkpoint at round " << round_ << ": "
                     << awaited.message();
    return absl::OkStatus();
  }
  WorkerCheckpoint c;
  c.round = round_;
  c.steps = steps_;
  c.slice = slice_;
  c.local_ranks = local_ != nullptr ? local_->size() : 1;
  c.shards = exchange_->job_config().num_shards();
  try {
    const absl::Span<const float> x = HostSlice();
    c.params.assign(x.begin(), x.end());
  } catch (...) {
    return TorchExceptionToStatus("Co2Optimizer: checkpoint of x");
  }
  c.anchor = exchange_->anchor();
  const absl::Span<const float> residual = exchange_->residual();
  c.residual.assign(residual.begin(), residual.end());
  const absl::Span<const float> offset = exchange_->start_offset();
  c.start_offset.assign(offset.begin(), offset.end());
  const absl::Span<const float> last = exchange_->last_delta();
  c.last_delta.assign(last.begin(), last.end());
  absl::Status saved = options_.save_checkpoint(c);
  if (rank_slices()) saved = AgreeOnStatus(std::move(saved));
  return saved;
}

absl::Status Co2Optimizer::CheckCheckpointFits(const WorkerCheckpoint& c) {
  const int ranks = local_ != nullptr ? local_->size() : 1;
  const uint32_t shards = exchange_->job_config().num_shards();
  const bool recorded = c.local_ranks != 0;
  const bool same_slice =
      c.slice.begin == slice_.begin && c.slice.end == slice_.end;
  // A leader-only checkpoint fits any number of local ranks.
  const bool fits =
      c.params.size() == slice_.size() &&
      (rank_slices() ? recorded &&
                           c.local_ranks == static_cast<uint32_t>(ranks) &&
                           c.shards == shards && same_slice
                     : !recorded || same_slice);
  if (fits) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "Co2Optimizer: the checkpoint holds ", c.params.size(),
      " parameters, [", c.slice.begin, ", ", c.slice.end, ") of the model, ",
      recorded ? absl::StrCat("taken with ", c.local_ranks,
                              " local ranks over ", c.shards, " shards")
               : std::string("with no layout recorded"),
      "; this rank exchanges [", slice_.begin, ", ", slice_.end, ") of ",
      flat_->numel(), rank_slices() ? " as one of " : " as the leader of ",
      ranks, " local ranks over ", shards,
      " shards: resume with the local ranks and shards the checkpoint was "
      "taken with"));
}

absl::Status Co2Optimizer::RestoreCheckpoint() {
  const WorkerCheckpoint& c = *options_.resume;
  if (!uses_aggregator_) {
    return absl::InvalidArgumentError(
        "Co2Optimizer: ddp does not resume from a WorkerCheckpoint");
  }
  if (start_round_ != c.round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Co2Optimizer: the checkpoint is of round ", c.round,
        ", the shards took this worker back at round ", start_round_,
        " (join with resume_round = the checkpoint's round)"));
  }
  if (exchange_ != nullptr) {
    absl::Status fits = CheckCheckpointFits(c);
    // A rank whose checkpoint does not fit stops the node's others too.
    if (rank_slices()) fits = AgreeOnStatus(std::move(fits));
    CO2_RETURN_IF_ERROR(fits);
    if (!c.residual.empty()) {
      CO2_RETURN_IF_ERROR(exchange_->RestoreResidual(c.residual));
    }
    if (!c.start_offset.empty()) {
      CO2_RETURN_IF_ERROR(
          exchange_->RestoreStartOffset(c.start_offset, c.last_delta));
    }
    try {
      SetSlice(c.params);
    } catch (...) {
      return TorchExceptionToStatus("Co2Optimizer: x <- the checkpoint's");
    }
  }
  if (local_ != nullptr && local_->size() > 1) {
    CO2_RETURN_IF_ERROR(BroadcastParams());
  }
  // The checkpoint was taken at this round's boundary, its steps done.
  steps_ = c.steps;
  steps_in_round_ = options_.tau;
  resuming_ = true;
  const absl::Status boundary = Boundary();
  resuming_ = false;
  return boundary;
}

}  // namespace co2::client
