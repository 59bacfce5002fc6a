#include "apps/co2-train/trainer_options.h"

#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "apps/co2-train/injected_fault.h"
#include "client/training/models.h"
#include "common/codec.h"
#include "common/status_macros.h"

namespace co2::client {
namespace {

absl::Status Bad(const std::string& flag, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", why));
}

}  // namespace

absl::StatusOr<v1::JobConfig> MakeJobConfig(const TrainerOptions& options,
                                            Algo algo) {
  v1::JobConfig c = common::DefaultJobConfig(0, 0);
  c.set_alpha(options.alpha);
  c.set_beta(options.beta);
  CO2_ASSIGN_OR_RETURN(v1::Momentum momentum,
                       common::ParseMomentum(options.momentum));
  c.set_momentum(momentum);
  c.set_momentum_period(options.momentum_period);
  CO2_ASSIGN_OR_RETURN(v1::GapPenalty penalty,
                       common::ParseGapPenalty(options.gap_penalty));
  c.set_gap_penalty(penalty);
  c.set_penalty_lambda(options.penalty_lambda);
  CO2_ASSIGN_OR_RETURN(v1::Clip clip, common::ParseClip(options.clip));
  c.set_clip(clip);
  c.set_clip_value(options.clip_value);
  CO2_ASSIGN_OR_RETURN(common::Codec down,
                       common::ParseCodec(options.downlink_codec));
  c.set_downlink_codec(static_cast<v1::Codec>(down));
  c.set_tau(options.tau);
  c.set_round_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options.round_timeout)));
  c.set_deterministic(options.deterministic);
  c.set_outlier_ratio(options.outlier_ratio);
  ApplyAlgo(algo, c);
  return c;
}

absl::StatusOr<std::vector<ScaleStep>> ParseScale(absl::string_view spec,
                                                  int workers) {
  std::vector<ScaleStep> steps;
  if (spec.empty()) return steps;
  for (absl::string_view entry : absl::StrSplit(spec, ',')) {
    const std::pair<absl::string_view, absl::string_view> parts =
        absl::StrSplit(entry, absl::MaxSplits(':', 1));
    ScaleStep step;
    if (!absl::SimpleAtoi(parts.first, &step.round) ||
        !absl::SimpleAtoi(parts.second, &step.count)) {
      return Bad("scale", absl::StrCat("entry '", entry,
                                       "' is not ROUND:COUNT (e.g. 20:4)"));
    }
    if (step.count < 1 || step.count > workers) {
      return Bad("scale",
                 absl::StrCat("entry '", entry, "': the count must be in [1, ",
                              workers, "] (--workers)"));
    }
    if (!steps.empty() && step.round <= steps.back().round) {
      return Bad("scale", absl::StrCat("entry '", entry,
                                       "': rounds must rise, after round ",
                                       steps.back().round));
    }
    steps.push_back(step);
  }
  return steps;
}

int InitialWorkers(const TrainerOptions& options) {
  const absl::StatusOr<std::vector<ScaleStep>> steps =
      ParseScale(options.scale, options.workers);
  if (steps.ok() && !steps->empty() && steps->front().round == 0) {
    return steps->front().count;
  }
  return options.workers;
}

bool RunsEagerUpdates(const TrainerOptions& options) {
  return options.eager && options.algo == "co2";
}

double DefaultLearningRate(absl::string_view task, absl::string_view algo) {
  const bool charlm = task == "charlm";
  if (algo == "diloco") return charlm ? 2e-3 : 5e-4;
  return charlm ? 8e-3 : 2e-3;
}

absl::Status ValidateTrainerOptions(const TrainerOptions& options) {
  CO2_ASSIGN_OR_RETURN(Task task, ParseTask(options.task));
  CO2_ASSIGN_OR_RETURN(ModelSize size, ParseModelSize(options.model));
  if (task == Task::kCharLm && size == ModelSize::kWide) {
    return Bad("model", "wide is for --task=fashion-mnist only");
  }
  CO2_ASSIGN_OR_RETURN(const Algo algo, ParseAlgo(options.algo));
  if (algo == Algo::kDiLoCo && options.momentum != "nesterov") {
    return Bad("momentum", absl::StrCat("is '", options.momentum,
                                        "': diloco runs Nesterov momentum"));
  }
  const absl::StatusOr<ApplyAt> apply = ParseApplyAt(options.apply);
  if (!apply.ok()) return Bad("apply", std::string(apply.status().message()));
  if (absl::Status s = CheckApplyAt(algo, *apply, options.deterministic);
      !s.ok()) {
    return Bad("apply", std::string(s.message()));
  }
  if (absl::Status s =
          CheckApplyBy(*apply, options.apply_by_step, options.tau);
      !s.ok()) {
    return Bad("apply_by_step", std::string(s.message()));
  }
  if (options.workers < 1)
    return Bad("workers", absl::StrCat("must be >= 1, got ", options.workers));
  if (options.local_ranks < 1) {
    return Bad("local_ranks",
               absl::StrCat("must be >= 1, got ", options.local_ranks));
  }
  CO2_RETURN_IF_ERROR(common::CheckLinkPath(options.link_path));
  if (options.rank_slices != "auto" && options.rank_slices != "on" &&
      options.rank_slices != "off") {
    return Bad("rank_slices", absl::StrCat("is '", options.rank_slices,
                                           "': auto | on | off"));
  }
  if (options.tau < 1)
    return Bad("tau", absl::StrCat("must be >= 1, got ", options.tau));
  if (options.epochs < 0)
    return Bad("epochs", absl::StrCat("must be >= 0, got ", options.epochs));
  if (options.steps < 0)
    return Bad("steps", absl::StrCat("must be >= 0, got ", options.steps));
  if (options.optimizer != "adamw" && options.optimizer != "sgd") {
    return Bad("optimizer", absl::StrCat("must be adamw or sgd, got '",
                                         options.optimizer, "'"));
  }
  if (!(options.lr > 0) || !std::isfinite(options.lr)) {
    return Bad("lr", absl::StrCat("must be > 0, got ", options.lr));
  }
  if (options.lr_schedule != "constant" && options.lr_schedule != "cosine") {
    return Bad("lr_schedule", absl::StrCat("must be constant or cosine, got '",
                                           options.lr_schedule, "'"));
  }
  if (options.batch_size < 1) {
    return Bad("batch_size",
               absl::StrCat("must be >= 1, got ", options.batch_size));
  }
  if (options.seq_len < 1)
    return Bad("seq_len", absl::StrCat("must be >= 1, got ", options.seq_len));
  if (options.shards < 1)
    return Bad("shards", absl::StrCat("must be >= 1, got ", options.shards));
  if (options.eval_every < 0) {
    return Bad("eval_every",
               absl::StrCat("must be >= 0, got ", options.eval_every));
  }
  if (options.threads < 1)
    return Bad("threads", absl::StrCat("must be >= 1, got ", options.threads));
  if (options.max_restarts < 0) {
    return Bad("max_restarts",
               absl::StrCat("must be >= 0, got ", options.max_restarts));
  }
  if (options.max_restarts > 0 && options.algo == "ddp") {
    return Bad("max_restarts",
               "needs an aggregator algorithm (not ddp): a worker restarts "
               "alone into the running job");
  }
  if (options.restart < 0) {
    return Bad("restart", absl::StrCat("must be >= 0, got ", options.restart));
  }
  CO2_ASSIGN_OR_RETURN(const std::vector<ScaleStep> scale,
                       ParseScale(options.scale, options.workers));
  if (!scale.empty() && options.algo == "ddp") {
    return Bad("scale",
               "needs an aggregator algorithm (not ddp): ddp's group cannot "
               "change size");
  }
  if (options.join && options.algo == "ddp") {
    return Bad("join", "needs an aggregator algorithm (not ddp)");
  }
  if (!options.checkpoint_dir.empty() && options.algo == "ddp") {
    return Bad("checkpoint_dir",
               "needs an aggregator algorithm (not ddp): the shards hold the "
               "job's state a resume continues from");
  }
  if (options.resume && options.checkpoint_dir.empty()) {
    return Bad("resume", "needs --checkpoint_dir, where the run saved its "
                         "checkpoints");
  }
  if (options.resume && (options.join || options.rejoin || !scale.empty())) {
    return Bad("resume",
               "resumes every worker of the job together: not with --join, "
               "--rejoin or --scale");
  }
  if (options.aggregators.empty() &&
      !(options.aggregator_ca + options.aggregator_cert +
        options.aggregator_key + options.aggregator_token_file)
           .empty()) {
    return Bad("aggregator_ca",
               "and the other --aggregator_* TLS flags are for external "
               "shards (--aggregators); embedded shards are plaintext");
  }
  CO2_RETURN_IF_ERROR(common::ParseCodec(options.codec).status());
  CO2_RETURN_IF_ERROR(ParseInjectedFault(options.inject_fault).status());
  CO2_ASSIGN_OR_RETURN(v1::JobConfig config, MakeJobConfig(options, algo));
  config.set_num_parameters(1);
  config.set_num_shards(1);
  return common::ValidateJobConfig(config);
}

}  // namespace co2::client
