#include "client/training/co2_optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/collectives/rank_gather.h"
#include "client/training/torch_status.h"
#include "common/fnv_hash.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace co2::client {
namespace {

size_t TensorBytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * t.element_size() : 0;
}

// Bytes of the state tensors of the optimizers LibTorch ships; 0 for others.
size_t OptimizerStateBytes(const torch::optim::Optimizer& opt) {
  size_t bytes = 0;
  for (const auto& [key, state] : opt.state()) {
    const torch::optim::OptimizerParamState* s = state.get();
    if (auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(s)) {
      bytes += TensorBytes(a->exp_avg()) + TensorBytes(a->exp_avg_sq()) +
               TensorBytes(a->max_exp_avg_sq());
    } else if (auto* b = dynamic_cast<const torch::optim::AdamParamState*>(s)) {
      bytes += TensorBytes(b->exp_avg()) + TensorBytes(b->exp_avg_sq()) +
               TensorBytes(b->max_exp_avg_sq());
    } else if (auto* c = dynamic_cast<const torch::optim::SGDParamState*>(s)) {
      bytes += TensorBytes(c->momentum_buffer());
    } else if (auto* d =
                   dynamic_cast<const torch::optim::AdagradParamState*>(s)) {
      bytes += TensorBytes(d->sum());
    } else if (auto* e =
                   dynamic_cast<const torch::optim::RMSpropParamState*>(s)) {
      bytes += TensorBytes(e->square_avg()) +
               TensorBytes(e->momentum_buffer()) + TensorBytes(e->grad_avg());
    }
  }
  return bytes;
}

// How one local rank's exchange ended, for the others (rank slices).
struct ExchangeOutcome {
  uint8_t ok = 0;
  uint8_t healed = 0;
  uint64_t round = 0;  // the round it healed to
};

// Rejoins in a row the ranks of a node try before they give up on
// holding the anchor of one round.
constexpr int kMaxRejoins = 8;

absl::Status RankFailed(size_t rank) {
  return absl::AbortedError(absl::StrCat(
      "local rank ", rank,
      "'s exchange failed (its log says why); the node's ranks stop with it"));
}

std::string RoundsOf(const std::vector<ExchangeOutcome>& all) {
  std::string rounds;
  for (size_t k = 0; k < all.size(); ++k) {
    absl::StrAppend(&rounds, k == 0 ? "" : ", ", "rank ", k, ": ",
                    all[k].healed ? absl::StrCat("round ", all[k].round)
                                  : std::string("not healed"));
  }
  return rounds;
}

}  // namespace

Co2Optimizer::Co2Optimizer(const Co2OptimizerOptions& options, FlatParams* flat,
                           torch::optim::Optimizer* inner,
                           std::unique_ptr<AggregatorClient> client,
                           ProcessGroup* local, ProcessGroup* global)
    : options_(options),
      flat_(flat),
      inner_(inner),
      client_(std::move(client)),
      local_(local),
      global_(global),
      leader_(local == nullptr || local->rank() == 0),
      uses_aggregator_(options.algo != Algo::kDdp) {}

Co2Optimizer::~Co2Optimizer() = default;

absl::StatusOr<std::unique_ptr<Co2Optimizer>> Co2Optimizer::Create(
    const Co2OptimizerOptions& options, FlatParams* flat,
    torch::optim::Optimizer* inner, std::unique_ptr<AggregatorClient> client,
    ProcessGroup* local, ProcessGroup* global) {
  if (flat == nullptr || inner == nullptr) {
    return absl::InvalidArgumentError(
        "Co2Optimizer: flat parameters and inner optimizer are required");
  }
  if (options.tau < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Co2Optimizer: tau must be >= 1, got ", options.tau));
  }
  if (options.algo == Algo::kCo2 && options.rounds == 0) {
    return absl::InvalidArgumentError(
        "Co2Optimizer: co2 needs rounds (the job's number of rounds) > 0");
  }
  if (options.samples_per_step <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Co2Optimizer: samples_per_step must be > 0, got ",
                     options.samples_per_step));
  }
  // Only the local leader holds the job's config; the others follow its
  // decisions.
  const bool deterministic =
      client != nullptr && client->job_config().deterministic();
  const ApplyAt apply =
      options.apply.value_or(DefaultApplyAt(options.algo, deterministic));
  if (absl::Status checked = CheckApplyAt(options.algo, apply, deterministic);
      !checked.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Co2Optimizer: apply=", checked.message()));
  }
  if (absl::Status by = CheckApplyBy(apply, options.apply_by_step, options.tau);
      !by.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Co2Optimizer: apply_by_step ", by.message()));
  }
  std::unique_ptr<Co2Optimizer> opt(new Co2Optimizer(
      options, flat, inner, std::move(client), local, global));
  opt->apply_ = apply;
  opt->carry_progress_ = options.carry_progress.value_or(
      DefaultCarryProgress(options.algo, options.eager_share != 0));
  CO2_RETURN_IF_ERROR(opt->Init());
  return opt;
}

absl::Status Co2Optimizer::Init() {
  const size_t p = static_cast<size_t>(flat_->numel());
  if (!uses_aggregator_) {
    if (client_ != nullptr) {
      return absl::InvalidArgumentError(
          "Co2Optimizer: ddp takes no aggregator client");
    }
  } else if (leader_ && client_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("Co2Optimizer: ", AlgoName(options_.algo),
                     " needs an aggregator client on the local leader"));
  }
  slice_ = common::Range{0, p};
  if (uses_aggregator_) CO2_RETURN_IF_ERROR(LearnSlices());
  if (client_ != nullptr &&
      client_->job_config().max_staleness() != StalenessOf(options_.algo)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Co2Optimizer: ", AlgoName(options_.algo),
                     " needs max_staleness ", StalenessOf(options_.algo),
                     ", the job has ", client_->job_config().max_staleness()));
  }
  try {
    if (!flat_->params().is_cpu()) staging_.resize(slice_.size());
    if (client_ != nullptr) {
      AnchorExchangeOptions eo;
      eo.rounds = options_.rounds;
      eo.samples_per_step = options_.samples_per_step;
      eo.update_timeout = options_.update_timeout;
      eo.push_timeout = options_.push_timeout;
      eo.leave_timeout = options_.leave_timeout;
      eo.uplink_codec = options_.uplink_codec;
      eo.clock = options_.clock;
      eo.reconnect = options_.reconnect;
      eo.eager_share = options_.eager_share;
      eo.carry_progress = carry_progress_;
      eo.apply_by_step = options_.apply_by_step;
      CO2_ASSIGN_OR_RETURN(
          exchange_,
          AnchorExchange::Create(eo, std::move(client_), HostSlice()));
      start_round_ = exchange_->start_round();
    }
  } catch (...) {
    return TorchExceptionToStatus("Co2Optimizer::Init");
  }
  if (rank_slices()) {
    // Every rank fetched its shards' anchor: they agree on one round as
    // after a heal.
    RoundStats start;
    start.healed_to = start_round_;
    absl::Status agreed;
    try {
      absl::Span<float> x = HostSlice();
      agreed = AgreeOnOutcome(absl::OkStatus(), x, start);
      if (agreed.ok() && !staging_.empty()) SetSlice(x);
    } catch (...) {
      return TorchExceptionToStatus("Co2Optimizer::Init");
    }
    CO2_RETURN_IF_ERROR(agreed);
    start_round_ = *start.healed_to;
  }
  if (local_ != nullptr && local_->size() > 1) {
    CO2_RETURN_IF_ERROR(FollowLeadersStart());
  }
  round_ = start_round_;
  anchor_round_ = start_round_;
  if (options_.resume != nullptr) return RestoreCheckpoint();
  float* x = flat_->params().data_ptr<float>();
  if (local_ != nullptr && local_->size() > 1) {
    CO2_RETURN_IF_ERROR(BroadcastParams());
  }
  if (options_.algo == Algo::kDdp && global_ != nullptr &&
      global_->size() > 1) {
    CO2_RETURN_IF_ERROR(global_->Broadcast(x, p, 0));
  }
  return absl::OkStatus();
}

absl::Status Co2Optimizer::LearnSlices() {
  if (local_ == nullptr || local_->size() == 1) return absl::OkStatus();
  struct Held {
    uint8_t client = 0;
    uint8_t resumes = 0;
    uint64_t begin = 0;
    uint64_t end = 0;
    uint64_t resume_round = 0;
  };
  Held mine;
  if (client_ != nullptr) {
    mine.client = 1;
    mine.begin = client_->slice().begin;
    mine.end = client_->slice().end;
  }
  if (options_.resume != nullptr) {
    mine.resumes = 1;
    mine.resume_round = options_.resume->round;
  }
  CO2_ASSIGN_OR_RETURN(const std::vector<Held> all,
                       GatherFromRanks(*local_, mine));
  int clients = 0;
  for (const Held& h : all) clients += h.client;
  if (clients == 1) {
    if (client_ != nullptr && !leader_) {
      return absl::InvalidArgumentError(
          absl::StrCat("Co2Optimizer: local rank ", local_->rank(),
                       " holds the node's only aggregator client; the local "
                       "leader (rank 0) exchanges for the node"));
    }
    return absl::OkStatus();
  }
  if (clients != local_->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Co2Optimizer: ", clients, " of ", local_->size(),
        " local ranks hold an aggregator client; give one to the local leader "
        "alone, or one to every rank for rank slices"));
  }
  const size_t p = static_cast<size_t>(flat_->numel());
  size_t next = 0;
  for (size_t k = 0; k < all.size(); ++k) {
    if (all[k].begin != next || all[k].end <= all[k].begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Co2Optimizer: local rank ", k, " exchanges [", all[k].begin, ", ",
          all[k].end, ") of the model, but the ranks' slices must tile [0, ",
          p, ") in rank order (the next starts at ", next,
          "): give rank k the shards common::OwnedShards(S, L, k)"));
    }
    slices_.push_back(common::Range{all[k].begin, all[k].end});
    next = all[k].end;
  }
  if (next != p) {
    return absl::InvalidArgumentError(
        absl::StrCat("Co2Optimizer: the local ranks' slices end at ", next,
                     ", the model has ", p, " parameters"));
  }
  for (size_t k = 0; k < all.size(); ++k) {
    if (all[k].resumes != all[0].resumes ||
        all[k].resume_round != all[0].resume_round) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Co2Optimizer: the local ranks resume from different rounds (rank "
          "0: ", all[0].resumes ? absl::StrCat(all[0].resume_round) : "none",
          ", rank ", k, ": ",
          all[k].resumes ? absl::StrCat(all[k].resume_round) : "none",
          "): their checkpoints are of different boundaries; rejoin the job "
          "(fetch the shards' anchor) instead of resuming"));
    }
  }
  slice_ = slices_[local_->rank()];
  return absl::OkStatus();
}

absl::Status Co2Optimizer::AgreeOnStatus(absl::Status status) {
  CO2_ASSIGN_OR_RETURN(const std::vector<uint8_t> ok,
                       GatherFromRanks(*local_, uint8_t{status.ok()}));
  if (!status.ok()) return status;
  for (size_t k = 0; k < ok.size(); ++k) {
    if (!ok[k]) return RankFailed(k);
  }
  return absl::OkStatus();
}

absl::Status Co2Optimizer::AgreeOnOutcome(absl::Status status,
                                          absl::Span<float> x,
                                          RoundStats& stats) {
  for (int rejoins = 0;; ++rejoins) {
    ExchangeOutcome mine;
    mine.ok = status.ok();
    mine.healed = stats.healed_to.has_value();
    mine.round = stats.healed_to.value_or(0);
    CO2_ASSIGN_OR_RETURN(const std::vector<ExchangeOutcome> all,
                         GatherFromRanks(*local_, mine));
    for (size_t k = 0; k < all.size(); ++k) {
      if (all[k].ok) continue;
      if (!status.ok()) return status;
      return RankFailed(k);
    }
    uint64_t newest = 0;
    bool any = false;
    for (const ExchangeOutcome& o : all) {
      if (o.healed) newest = any ? std::max(newest, o.round) : o.round;
      any = any || o.healed;
    }
    if (!any) return absl::OkStatus();
    const bool one_round = std::all_of(
        all.begin(), all.end(), [&](const ExchangeOutcome& o) {
          return o.healed && o.round == newest;
        });
    if (one_round) return absl::OkStatus();
    if (rejoins == kMaxRejoins) {
      return absl::AbortedError(absl::StrCat(
          "the node's local ranks hold the anchors of different rounds after ",
          kMaxRejoins, " rejoins (", RoundsOf(all),
          "); stopping rather than train on mixed models"));
    }
    if (mine.healed && mine.round == newest) continue;
    CO2_LOG(WARNING) << "local rank " << local_->rank()
                     << " rejoins its shards: the node's ranks must hold one "
                        "round's anchor ("
                     << RoundsOf(all) << ")";
    ExchangeTimes times;
    status = exchange_->Rejoin("a local rank healed", x, times);
    stats.healed_to = times.healed_round;
    if (stats.heal_reason == nullptr) stats.heal_reason = times.heal_reason;
    stats.heal_time += times.heal_time;
  }
}

absl::Status Co2Optimizer::ShareSlices(float* model) {
  for (int k = 0; k < local_->size(); ++k) {
    CO2_RETURN_IF_ERROR(
        local_->Broadcast(model + slices_[k].begin, slices_[k].size(), k));
  }
  return absl::OkStatus();
}

absl::Status Co2Optimizer::BroadcastParams() {
  float* x = flat_->params().data_ptr<float>();
  if (!rank_slices()) {
    return local_->Broadcast(x, static_cast<size_t>(flat_->numel()), 0);
  }
  return ShareSlices(x);
}

absl::StatusOr<std::vector<float>> Co2Optimizer::GatherAnchor() {
  if (!rank_slices()) return exchange_->anchor();
  std::vector<float> anchor(static_cast<size_t>(flat_->numel()));
  const std::vector<float>& mine = exchange_->anchor();
  std::copy(mine.begin(), mine.end(), anchor.begin() + slice_.begin);
  CO2_RETURN_IF_ERROR(ShareSlices(anchor.data()));
  return anchor;
}

absl::Status Co2Optimizer::FollowLeadersStart() {
  // Exact in a float for any run shorter than 2^24 rounds.
  float start[2] = {static_cast<float>(start_round_),
                    apply_ == ApplyAt::kArrival ? 1.0f : 0.0f};
  CO2_RETURN_IF_ERROR(local_->Broadcast(start, 2, 0));
  start_round_ = static_cast<uint64_t>(start[0]);
  const ApplyAt leaders = start[1] != 0 ? ApplyAt::kArrival : ApplyAt::kBoundary;
  if (options_.apply.has_value() && *options_.apply != leaders) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Co2Optimizer: apply=", ApplyAtName(*options_.apply), " on local rank ",
        local_->rank(), ", but the local leader applies at ",
        ApplyAtName(leaders), "; give every local rank the same apply"));
  }
  apply_ = leaders;
  return absl::OkStatus();
}

void Co2Optimizer::SetParams(absl::Span<const float> host) {
  torch::NoGradGuard no_grad;
  flat_->params().copy_(torch::from_blob(const_cast<float*>(host.data()),
                                         {flat_->numel()}, torch::kFloat));
}

absl::Span<float> Co2Optimizer::HostSlice() {
  if (staging_.empty()) {
    return flat_->ParamSpan().subspan(slice_.begin, slice_.size());
  }
  torch::Tensor host = torch::from_blob(
      staging_.data(), {static_cast<int64_t>(staging_.size())}, torch::kFloat);
  host.copy_(flat_->params().narrow(0, static_cast<int64_t>(slice_.begin),
                                    static_cast<int64_t>(slice_.size())));
  return absl::MakeSpan(staging_);
}

void Co2Optimizer::SetSlice(absl::Span<const float> host) {
  torch::NoGradGuard no_grad;
  flat_->params()
      .narrow(0, static_cast<int64_t>(slice_.begin),
              static_cast<int64_t>(slice_.size()))
      .copy_(torch::from_blob(const_cast<float*>(host.data()),
                              {static_cast<int64_t>(host.size())},
                              torch::kFloat));
}

void Co2Optimizer::ZeroGrad() { flat_->ZeroGrads(); }

absl::Status Co2Optimizer::EvaluateAtAnchor(
    absl::FunctionRef<absl::Status()> evaluate) {
  if (exchange_ == nullptr || !OffsetFromAnchor()) {
    return evaluate();
  }
  CO2_ASSIGN_OR_RETURN(const std::vector<float> anchor, GatherAnchor());
  std::vector<float> x;
  try {
    torch::Tensor live = flat_->params().to(torch::kCPU).contiguous();
    x.assign(live.data_ptr<float>(), live.data_ptr<float>() + live.numel());
    SetParams(anchor);
  } catch (...) {
    return TorchExceptionToStatus("Co2Optimizer::EvaluateAtAnchor");
  }
  const absl::Status status = evaluate();
  try {
    SetParams(x);
  } catch (...) {
    return TorchExceptionToStatus("Co2Optimizer::EvaluateAtAnchor restore");
  }
  return status;
}

absl::Status Co2Optimizer::Step() {
  if (broken_ || finished_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Co2Optimizer::Step after ",
        !finished_ ? "an error" : left_ ? "leaving the job" : "Finish"));
  }
  if (options_.rounds > 0 && round_ >= options_.rounds) {
    return absl::FailedPreconditionError(
        absl::StrCat("Co2Optimizer::Step in round ", round_,
                     ", past the job's last round ", options_.rounds - 1));
  }
  common::Clock* clock = options_.clock;
  const absl::Time start = clock->Now();
  absl::Status status = absl::OkStatus();
  try {
    flat_->RebindGrads();
    float* grads = flat_->grads().data_ptr<float>();
    const size_t count = static_cast<size_t>(flat_->numel());
    if (options_.algo == Algo::kDdp && global_ != nullptr &&
        global_->size() > 1) {
      // One all-reduce over every rank of the job gives the global mean; the
      // node-local mean first would only repeat part of it.
      const absl::Time t = clock->Now();
      status = global_->AllReduceMean(grads, count);
      current_.exposed_comm += clock->Now() - t;
      current_.bytes_sent += count * sizeof(float);
    } else if (local_ != nullptr && local_->size() > 1) {
      status = local_->AllReduceMean(grads, count);
    }
    if (status.ok()) inner_->step();
  } catch (...) {
    status = TorchExceptionToStatus("Co2Optimizer::Step");
  }
  if (!status.ok()) {
    broken_ = true;
    return status;
  }
  current_.compute += clock->Now() - start;
  ++current_.steps;
  ++steps_;
  absl::Status exchanged = absl::OkStatus();
  if (++steps_in_round_ == options_.tau) {
    exchanged = Boundary();
  } else if (apply_ == ApplyAt::kArrival && !applied_this_round_) {
    exchanged = ApplyIfArrived();
  }
  if (!exchanged.ok()) broken_ = true;
  return exchanged;
}

absl::Status Co2Optimizer::AwaitOwedUpdateForTesting() {
  if (exchange_ == nullptr) return absl::OkStatus();
  const std::optional<uint64_t> owed =
      OwedUpdate(exchange_->staleness(), options_.rounds, round_);
  if (!owed) return absl::OkStatus();
  ExchangeTimes times;
  return exchange_->AwaitUpdate(*owed, times);
}

absl::Status Co2Optimizer::ApplyIfArrived() {
  // The checkpoint of this boundary holds A_r and x against it.
  bool apply = exchange_ != nullptr && !CheckpointDue() &&
               exchange_->ApplyDue(round_, steps_in_round_);
  if (rank_slices()) {
    // Once every rank's slice has arrived (or, from apply_by_step, on every
    // rank at the same step).
    CO2_ASSIGN_OR_RETURN(const std::vector<uint8_t> due,
                         GatherFromRanks(*local_, uint8_t{apply}));
    apply = std::all_of(due.begin(), due.end(), [](uint8_t d) { return d; });
  } else if (local_ != nullptr && local_->size() > 1) {
    float decided = apply ? 1.0f : 0.0f;
    CO2_RETURN_IF_ERROR(local_->Broadcast(&decided, 1, 0));
    apply = decided > 0;
  }
  if (!apply) return absl::OkStatus();
  RoundStats& stats = current_;
  const absl::Time start = options_.clock->Now();
  CO2_RETURN_IF_ERROR(ExchangeAndBroadcast(
      [&](absl::Span<float> x, ExchangeTimes& times) {
        return exchange_->ApplyOwed(round_, steps_in_round_, x, times);
      },
      stats));
  stats.boundary += options_.clock->Now() - start;
  applied_this_round_ = true;
  stats.applied_after_steps = steps_in_round_;
  if (!stats.healed_to) return absl::OkStatus();
  // The leader healed: the round ends here, at the shards' round.
  RoundStats healed = stats;
  healed.round = round_;
  anchor_round_ = *healed.healed_to;
  return EndRound(healed);
}

absl::Status Co2Optimizer::ExchangeAndBroadcast(
    absl::FunctionRef<absl::Status(absl::Span<float>, ExchangeTimes&)>
        exchange,
    RoundStats& stats) {
  if (exchange_ != nullptr) {
    absl::Status status = absl::OkStatus();
    try {
      absl::Span<float> x = HostSlice();
      ExchangeTimes times;
      status = exchange(x, times);
      stats.exposed_comm += times.exposed_comm;
      stats.push += times.push;
      stats.bytes_sent += times.bytes_sent;
      stats.anchor_mismatches += times.anchor_mismatches;
      stats.healed_to = times.healed_round;
      stats.heal_reason = times.heal_reason;
      stats.heal_time = times.heal_time;
      if (rank_slices()) status = AgreeOnOutcome(std::move(status), x, stats);
      if (status.ok() && !staging_.empty()) SetSlice(x);
    } catch (...) {
      status = TorchExceptionToStatus("Co2Optimizer: x <- A");
    }
    CO2_RETURN_IF_ERROR(status);
  }
  leave_now_ = leader_ && leave_requested_;
  if (local_ != nullptr && local_->size() > 1) {
    CO2_RETURN_IF_ERROR(BroadcastParams());
    if (uses_aggregator_) {
      // The round the leader healed to, or −1 (exact in a float for any run
      // shorter than 2^24 rounds), and whether it leaves now.
      float signal[2] = {
          stats.healed_to ? static_cast<float>(*stats.healed_to) : -1.0f,
          leave_now_ ? 1.0f : 0.0f};
      CO2_RETURN_IF_ERROR(local_->Broadcast(signal, 2, 0));
      stats.healed_to.reset();
      if (signal[0] >= 0) stats.healed_to = static_cast<uint64_t>(signal[0]);
      leave_now_ = signal[1] > 0;
    }
  }
  return absl::OkStatus();
}

absl::Status Co2Optimizer::Boundary() {
  RoundStats stats = current_;
  stats.round = round_;
  const absl::Time start = options_.clock->Now();
  if (uses_aggregator_) {
    CO2_RETURN_IF_ERROR(SaveCheckpoint(stats));
    CO2_RETURN_IF_ERROR(ExchangeAndBroadcast(
        [&](absl::Span<float> x, ExchangeTimes& times) {
          return exchange_->Boundary(round_, steps_in_round_, x, times);
        },
        stats));
    anchor_round_ = stats.healed_to.value_or(round_ + 1);
  }
  stats.boundary += options_.clock->Now() - start;
  return EndRound(stats);
}

absl::Status Co2Optimizer::EndRound(RoundStats stats) {
  if (options_.hash_params) {
    CO2_ASSIGN_OR_RETURN(stats.params_hash, BoundaryHash());
  }
  rounds_.push_back(stats);
  current_ = RoundStats();
  applied_this_round_ = false;
  // A healed worker holds the anchor that starts the round it rejoined at.
  round_ = stats.healed_to.value_or(round_ + 1);
  steps_in_round_ = 0;
  const bool last = options_.rounds > 0 && round_ >= options_.rounds;
  if (uses_aggregator_ && leave_now_ && !last) return End(/*leaving=*/true);
  return absl::OkStatus();
}

// Heals in a row Finish allows before it gives up on the last update.
constexpr int kMaxDrains = 4;

absl::Status Co2Optimizer::Finish() {
  if (finished_) return absl::OkStatus();
  if (broken_) {
    return absl::FailedPreconditionError("Co2Optimizer::Finish after an error");
  }
  absl::Status status = absl::OkStatus();
  if (steps_in_round_ > 0) status = Boundary();
  if (!status.ok() || finished_) return status;
  return End(/*leaving=*/false);
}

absl::Status Co2Optimizer::End(bool leaving) {
  // The update of the last round is still in flight: apply it, so that the
  // final model is the final anchor on every worker (a leaving worker: that
  // its Δ is counted). A heal moves the worker to the shards' round, which
  // may owe one more; a leaving worker that healed owes nothing.
  absl::Status status = absl::OkStatus();
  std::optional<uint64_t> owed = OwedUpdate(
      StalenessOf(options_.algo), leaving ? round_ : options_.rounds, round_);
  for (int drains = 0; status.ok() && uses_aggregator_ && owed; ++drains) {
    if (drains == kMaxDrains) {
      status = absl::UnavailableError(
          absl::StrCat("Co2Optimizer::Finish: still owing the update of round ",
                       *owed, " after ", kMaxDrains, " heals"));
      break;
    }
    RoundStats drain;
    drain.round = round_;
    const absl::Time start = options_.clock->Now();
    status = ExchangeAndBroadcast(
        [&](absl::Span<float> x, ExchangeTimes& times) {
          return exchange_->Drain(*owed, x, times);
        },
        drain);
    owed.reset();
    if (status.ok()) {
      anchor_round_ = drain.healed_to.value_or(round_ + 1);
      if (drain.healed_to) {
        round_ = *drain.healed_to;
        if (!leaving) {
          owed =
              OwedUpdate(StalenessOf(options_.algo), options_.rounds, round_);
        }
      }
    }
    drain.boundary = options_.clock->Now() - start;
    if (status.ok() && options_.hash_params) drain.params_hash = ParamsHash();
    if (status.ok()) rounds_.push_back(drain);
  }
  if (status.ok() && exchange_ != nullptr && options_.verify_final_anchor &&
      !leaving) {
    status = exchange_->VerifyAnchor(anchor_round_);
  }
  if (rank_slices() && options_.verify_final_anchor && !leaving) {
    // Every rank checked its slice; one rank's mismatch fails the node.
    status = AgreeOnStatus(std::move(status));
  }
  if (!status.ok()) {
    broken_ = true;
    return status;
  }
  if (exchange_ != nullptr) exchange_->Leave();
  finished_ = true;
  left_ = leaving;
  return absl::OkStatus();
}

absl::Duration Co2Optimizer::total_exposed_comm() const {
  absl::Duration total;
  for (const RoundStats& r : rounds_) total += r.exposed_comm;
  return total + current_.exposed_comm;
}

absl::Duration Co2Optimizer::total_compute() const {
  absl::Duration total;
  for (const RoundStats& r : rounds_) total += r.compute;
  return total + current_.compute;
}

uint64_t Co2Optimizer::bytes_sent() const {
  uint64_t total = current_.bytes_sent;
  for (const RoundStats& r : rounds_) total += r.bytes_sent;
  return total;
}

MemoryReport Co2Optimizer::Memory() const {
  MemoryReport report;
  report.params = flat_->numel() * sizeof(float);
  report.grads = flat_->numel() * sizeof(float);
  if (exchange_ != nullptr) {
    const AnchorExchange::StateBytes state = exchange_->state_bytes();
    report.anchor = state.anchor;
    report.client_buffers = state.client_buffers;
  }
  report.staging = staging_.size() * sizeof(float);
  report.optimizer_state = OptimizerStateBytes(*inner_);
  return report;
}

absl::StatusOr<uint64_t> Co2Optimizer::BoundaryHash() {
  if (!OffsetFromAnchor()) {
    return ParamsHash();
  }
  uint64_t hash = exchange_ != nullptr
                      ? common::Fnv1a(absl::MakeConstSpan(exchange_->anchor()))
                      : 0;
  if (rank_slices()) {
    // A hash of the ranks' slice hashes, the same on every rank.
    CO2_ASSIGN_OR_RETURN(const std::vector<uint64_t> slices,
                         GatherFromRanks(*local_, hash));
    return common::Fnv1a(absl::MakeConstSpan(
        reinterpret_cast<const float*>(slices.data()),
        slices.size() * sizeof(uint64_t) / sizeof(float)));
  }
  if (local_ != nullptr && local_->size() > 1) {
    CO2_RETURN_IF_ERROR(BroadcastFromRank(*local_, hash, 0));
  }
  return hash;
}

uint64_t Co2Optimizer::ParamsHash() const {
  torch::Tensor host = flat_->params().to(torch::kCPU).contiguous();
  return common::Fnv1a(absl::MakeConstSpan(host.data_ptr<float>(),
                                           static_cast<size_t>(host.numel())));
}

}  // namespace co2::client
