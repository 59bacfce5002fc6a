// Co2Optimizer's checkpoint side: when a worker checkpoint is due, what it
// holds (Co2OptimizerOptions::save_checkpoint), and how a worker resumes
// from one (Co2OptimizerOptions::resume). The rest of the class is in
// co2_optimizer.cc.
#include <optional>

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
  if (owed) {
    ExchangeTimes times;
    const absl::Status awaited = exchange_->AwaitUpdate(*owed, times);
    stats.exposed_comm += times.exposed_comm;
    if (!awaited.ok()) {
      // The boundary meets the same failure and heals or fails with it.
      CO2_LOG(WARNING) << "no checkpoint at round " << round_ << ": "
                       << awaited.message();
      return absl::OkStatus();
    }
  }
  WorkerCheckpoint c;
  c.round = round_;
  c.steps = steps_;
  try {
    const absl::Span<const float> x = HostParams();
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
  return options_.save_checkpoint(c);
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
  const size_t p = static_cast<size_t>(flat_->numel());
  if (exchange_ != nullptr) {
    if (c.params.size() != p) {
      return absl::InvalidArgumentError(
          absl::StrCat("Co2Optimizer: the checkpoint holds ", c.params.size(),
                       " parameters, the model ", p));
    }
    if (!c.residual.empty()) {
      CO2_RETURN_IF_ERROR(exchange_->RestoreResidual(c.residual));
    }
    if (!c.start_offset.empty()) {
      CO2_RETURN_IF_ERROR(
          exchange_->RestoreStartOffset(c.start_offset, c.last_delta));
    }
    try {
      SetParams(c.params);
    } catch (...) {
      return TorchExceptionToStatus("Co2Optimizer: x <- the checkpoint's");
    }
  }
  if (local_ != nullptr && local_->size() > 1) {
    CO2_RETURN_IF_ERROR(
        local_->Broadcast(flat_->params().data_ptr<float>(), p, 0));
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
