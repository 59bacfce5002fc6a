#include "apps/co2-train/trainer.h"

#include <signal.h>
#include <torch/torch.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "apps/co2-train/run_report.h"
#include "apps/co2-train/task_data.h"
#include "apps/co2-train/worker_checkpoint.h"
#include "client/aggregator_client.h"
#include "client/collectives/process_group.h"
#include "client/training/batches.h"
#include "client/training/char_corpus.h"
#include "client/training/co2_optimizer.h"
#include "client/training/fashion_mnist.h"
#include "client/training/flat_params.h"
#include "client/training/models.h"
#include "client/training/torch_status.h"
#include "client/worker_metrics.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/tls_config.h"

namespace co2::client {
namespace {

absl::Status Bad(const std::string& flag, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", why));
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeInner(
    const TrainerOptions& options, const std::vector<torch::Tensor>& params) {
  try {
    if (options.optimizer == "sgd") {
      return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::SGD(
          params, torch::optim::SGDOptions(options.lr)
                      .momentum(0.9)
                      .weight_decay(options.weight_decay)));
    }
    return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::AdamW(
        params, torch::optim::AdamWOptions(options.lr)
                    .weight_decay(options.weight_decay)));
  } catch (...) {
    return TorchExceptionToStatus("inner optimizer");
  }
}

double LearningRate(const TrainerOptions& options, int64_t step,
                    int64_t total) {
  if (options.lr_schedule != "cosine" || total <= 1) return options.lr;
  const double progress = static_cast<double>(step) / (total - 1);
  return 0.5 * options.lr * (1.0 + std::cos(M_PI * progress));
}

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

std::string Hex(uint64_t h) { return absl::StrFormat("%016x", h); }

GroupOptions MakeGroup(const TrainerOptions& options, int rank, int size,
                       const std::string& prefix,
                       const std::string& address = "127.0.0.1") {
  GroupOptions g;
  g.backend = Backend::kGloo;
  g.rank = rank;
  g.size = size;
  g.store_dir = absl::StrCat(options.run_dir, "/store");
  g.prefix = prefix;
  g.timeout = options.group_timeout;
  g.address = address;
  return g;
}

// SIGTERM: leave the job at the next boundary (Co2Optimizer::RequestLeave).
volatile std::sig_atomic_t leave_signalled = 0;
extern "C" void OnLeaveSignal(int) { leave_signalled = 1; }

// inject_fault: dies as kill -9 would, with a log line saying where.
[[noreturn]] void KillSelf(const std::string& where) {
  CO2_LOG(WARNING) << "inject_fault: SIGKILL " << where;
  std::fflush(nullptr);
  raise(SIGKILL);
  std::abort();
}

}  // namespace

absl::StatusOr<InjectedFault> ParseInjectedFault(absl::string_view spec) {
  InjectedFault f;
  if (spec.empty()) return f;
  const std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(spec, absl::MaxSplits(':', 1));
  if (!absl::SimpleAtoi(parts.first, &f.worker) || f.worker < 0) {
    return Bad("inject_fault", absl::StrCat("must be WORKER:WHAT, got '", spec,
                                            "' (bad worker)"));
  }
  absl::string_view what = parts.second;
  if (absl::ConsumePrefix(&what, "kill_in_round=")) {
    f.kind = InjectedFault::Kind::kKillInRound;
    if (!absl::SimpleAtoi(what, &f.round) || f.round < 0) {
      return Bad(
          "inject_fault",
          absl::StrCat("kill_in_round needs a round >= 0, got '", spec, "'"));
    }
  } else if (what == "kill_before_finish") {
    f.kind = InjectedFault::Kind::kKillBeforeFinish;
  } else if (what == "kill_after_finish") {
    f.kind = InjectedFault::Kind::kKillAfterFinish;
  } else if (what == "flip_final_bit") {
    f.kind = InjectedFault::Kind::kFlipFinalBit;
  } else if (absl::ConsumePrefix(&what, "scale_delta=")) {
    f.kind = InjectedFault::Kind::kScaleDelta;
    const std::pair<absl::string_view, absl::string_view> rounds =
        absl::StrSplit(what, absl::MaxSplits('-', 1));
    f.last_round = UINT64_MAX;
    if (!absl::SimpleAtoi(rounds.first, &f.round) || f.round < 0 ||
        (!rounds.second.empty() &&
         (!absl::SimpleAtoi(rounds.second, &f.last_round) ||
          f.last_round < static_cast<uint64_t>(f.round))) ||
        what.find('-') == absl::string_view::npos) {
      return Bad("inject_fault",
                 absl::StrCat("scale_delta needs rounds A-B (B >= A >= 0) or "
                              "A-, got '",
                              spec, "'"));
    }
  } else {
    return Bad("inject_fault",
               absl::StrCat("unknown fault in '", spec,
                            "' (kill_in_round=R, kill_before_finish, "
                            "kill_after_finish, flip_final_bit, "
                            "scale_delta=A-B)"));
  }
  return f;
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

absl::Status CheckDataset(const TrainerOptions& options) {
  CO2_ASSIGN_OR_RETURN(Task task, ParseTask(options.task));
  if (task == Task::kFashionMnist) {
    FashionMnistOptions fashion_options;
    fashion_options.directory = options.data_dir;
    return LoadFashionMnist(fashion_options).status();
  }
  CharCorpusOptions corpus_options;
  corpus_options.directory = options.corpus_dir;
  return CharCorpus::Load(corpus_options).status();
}

std::string RankReportPath(const std::string& run_dir, int worker,
                           int local_rank) {
  return absl::StrCat(run_dir, "/rank-", worker, "-", local_rank, ".json");
}

std::string ProgressPath(const std::string& run_dir) {
  return absl::StrCat(run_dir, "/progress.txt");
}

absl::Status RunWorker(const TrainerOptions& options, int worker,
                       int local_rank) {
  const absl::Time started = absl::Now();
  CO2_RETURN_IF_ERROR(ValidateTrainerOptions(options));
  if (worker < 0 || worker >= options.workers || local_rank < 0 ||
      local_rank >= options.local_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank (", worker, ", ", local_rank, ") outside ",
                     options.workers, " x ", options.local_ranks));
  }
  CO2_ASSIGN_OR_RETURN(Task task, ParseTask(options.task));
  CO2_ASSIGN_OR_RETURN(Algo algo, ParseAlgo(options.algo));
  const int world = options.workers * options.local_ranks;
  const int rank = worker * options.local_ranks + local_rank;
  const bool leader = local_rank == 0;
  const int initial_workers = InitialWorkers(options);
  if (worker >= initial_workers && !options.join && !options.rejoin) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " is not one of the ", initial_workers,
        " workers the job starts with (--scale=", options.scale,
        "): start it with --join"));
  }
  at::set_num_threads(options.threads);
  CO2_ASSIGN_OR_RETURN(InjectedFault fault,
                       ParseInjectedFault(options.inject_fault));
  if (algo != Algo::kDdp) {
    // From here on SIGTERM means: leave the job at the next boundary (the
    // first one, when it comes before training starts).
    struct sigaction action = {};
    action.sa_handler = OnLeaveSignal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, nullptr);
  }
  // The launcher starts workers with SIGTERM blocked until here.
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_UNBLOCK, &term, nullptr);
  if (fault.worker != worker || options.rejoin) fault = InjectedFault();

  if (leader) {
    CO2_RETURN_IF_ERROR(common::CheckLinkPathAndLogHostTcp(options.link_path));
  }
  // Served from the start, before the data loads and the shards answer, so
  // that a worker still waiting for them is seen (co2_build_info,
  // process_*); the training series appear with the optimizer.
  std::unique_ptr<WorkerMetrics> metrics;  // leaders with --metrics_port
  if (leader && options.metrics_port >= 0) {
    CO2_ASSIGN_OR_RETURN(
        metrics,
        WorkerMetrics::Serve(
            absl::StrCat(options.metrics_host, ":", options.metrics_port),
            options.job.empty() ? "co2-train" : options.job,
            absl::StrCat("worker-", worker), options.link_path));
  }

  TaskData data;
  CO2_RETURN_IF_ERROR(LoadTaskData(options, task, rank, world, data));
  const int64_t total_steps = TotalSteps(options, data.steps_per_epoch);

  ModelOptions model_options;
  model_options.seed = options.seed;
  CO2_ASSIGN_OR_RETURN(model_options.size, ParseModelSize(options.model));
  CO2_ASSIGN_OR_RETURN(std::shared_ptr<TaskModel> model,
                       MakeModel(task, model_options));
  model->train();
  CO2_ASSIGN_OR_RETURN(std::unique_ptr<FlatParams> flat,
                       FlatParams::Create(model->parameters()));
  CO2_ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> inner,
                       MakeInner(options, model->parameters()));
  const std::string job = options.job.empty() ? "co2-train" : options.job;
  const std::string checkpoint_path =
      WorkerCheckpointPath(options.checkpoint_dir, worker);
  std::optional<WorkerCheckpoint> resumed;
  if (options.resume && algo != Algo::kDdp) {
    CO2_ASSIGN_OR_RETURN(resumed,
                         LoadWorkerCheckpoint(checkpoint_path, job, *inner));
    // The leader joins with the anchor the checkpoint's round starts from.
    if (resumed->anchor.size() != static_cast<size_t>(flat->numel())) {
      return absl::DataLossError(absl::StrCat(
          checkpoint_path, " holds an anchor of ", resumed->anchor.size(),
          " parameters, the model has ", flat->numel()));
    }
    std::copy(resumed->anchor.begin(), resumed->anchor.end(),
              flat->ParamSpan().begin());
  }

  std::unique_ptr<ProcessGroup> local, global;
  if (options.local_ranks > 1) {
    // A restarted node meets under a name of its own: the store still
    // holds the keys of the ranks that died.
    CO2_ASSIGN_OR_RETURN(
        local, CreateProcessGroup(MakeGroup(
                   options, local_rank, options.local_ranks,
                   absl::StrCat("node-", worker, "-", options.restart))));
  }
  if (algo == Algo::kDdp && world > 1) {
    CO2_ASSIGN_OR_RETURN(
        global, CreateProcessGroup(MakeGroup(options, rank, world, "global",
                                             options.group_address)));
  }
  CO2_ASSIGN_OR_RETURN(common::Codec uplink, common::ParseCodec(options.codec));
  std::unique_ptr<AggregatorClient> client;
  ClientOptions client_options;
  if (algo != Algo::kDdp && leader) {
    client_options.addresses = options.aggregators;
    client_options.job = job;
    client_options.worker_id = absl::StrCat("worker-", worker);
    CO2_ASSIGN_OR_RETURN(client_options.job_config,
                         MakeJobConfig(options, algo));
    client_options.job_config.set_rounds(
        static_cast<uint64_t>((total_steps + options.tau - 1) / options.tau));
    client_options.rejoin = options.rejoin;
    if (resumed) client_options.resume_round = resumed->round;
    client_options.uplink_codec = uplink;
    client_options.tls.ca_file = options.aggregator_ca;
    client_options.tls.cert_file = options.aggregator_cert;
    client_options.tls.key_file = options.aggregator_key;
    if (!options.aggregator_token_file.empty()) {
      CO2_ASSIGN_OR_RETURN(
          client_options.token,
          common::ReadTokenFile(options.aggregator_token_file));
    }
    client_options.connect_timeout = options.connect_timeout;
    client_options.reconnect_timeout = options.connect_timeout;
    client_options.rpc_timeout =
        std::min(options.connect_timeout, absl::Seconds(30));
    auto connected =
        AggregatorClient::Connect(client_options, flat->ParamSpan());
    if (!connected.ok()) {
      return absl::Status(connected.status().code(),
                          absl::StrCat("connecting to the aggregator (",
                                       absl::StrJoin(options.aggregators, ","),
                                       "): ", connected.status().message()));
    }
    client = std::move(*connected);
    if (initial_workers > 1 && !options.rejoin && !options.join) {
      // Every worker joins before anyone pushes round 0, so that all of them
      // are required for every round: the rendezvous is the barrier. A
      // restarted or joining worker enters a running job and skips it.
      CO2_ASSIGN_OR_RETURN(
          std::unique_ptr<ProcessGroup> leaders,
          CreateProcessGroup(MakeGroup(options, worker, initial_workers,
                                       "leaders", options.group_address)));
      float token = 1;
      CO2_RETURN_IF_ERROR(leaders->AllReduceMean(&token, 1));
    }
  }

  Co2OptimizerOptions optimizer_options;
  optimizer_options.algo = algo;
  optimizer_options.tau = options.tau;
  optimizer_options.samples_per_step =
      static_cast<double>(options.batch_size) * options.local_ranks;
  optimizer_options.update_timeout = options.update_timeout;
  optimizer_options.push_timeout = options.update_timeout;
  optimizer_options.uplink_codec = uplink;
  optimizer_options.hash_params = options.hash_params;
  optimizer_options.verify_final_anchor = options.verify_final_anchor;
  if (RunsEagerUpdates(options)) {
    optimizer_options.eager_share = 1.0 / options.workers;
  }
  optimizer_options.carry_progress = options.carry_progress;
  // ValidateTrainerOptions parsed it.
  optimizer_options.apply = ParseApplyAt(options.apply).value();
  optimizer_options.apply_by_step = options.apply_by_step;
  if (client != nullptr && options.heal) {
    optimizer_options.reconnect = [client_options](absl::Span<float> anchor) {
      ClientOptions rejoin = client_options;
      rejoin.rejoin = true;
      rejoin.resume_round.reset();  // it fetches the shards' anchor
      return AggregatorClient::Connect(rejoin, anchor);
    };
  }
  const int64_t total_rounds = (total_steps + options.tau - 1) / options.tau;
  optimizer_options.rounds = static_cast<uint64_t>(total_rounds);
  if (!options.checkpoint_dir.empty()) {
    optimizer_options.checkpoint_every = 1;
    optimizer_options.save_checkpoint =
        [&checkpoint_path, &job, &inner](const WorkerCheckpoint& c) {
          return SaveWorkerCheckpoint(checkpoint_path, job, c, *inner);
        };
  }
  if (resumed) optimizer_options.resume = &*resumed;
  CO2_ASSIGN_OR_RETURN(
      std::unique_ptr<Co2Optimizer> co2,
      Co2Optimizer::Create(optimizer_options, flat.get(), inner.get(),
                           std::move(client), local.get(), global.get()));
  if (fault.kind == InjectedFault::Kind::kScaleDelta) {
    CO2_LOG(WARNING) << "inject_fault: the delta of rounds " << fault.round
                     << " to "
                     << (fault.last_round == UINT64_MAX
                             ? std::string("the end")
                             : absl::StrCat(fault.last_round))
                     << " is multiplied by " << kInjectedDeltaScale;
    co2->ScaleDeltasForTesting(kInjectedDeltaScale,
                               static_cast<uint64_t>(fault.round),
                               fault.last_round);
  }
  if (resumed) {
    CO2_LOG(INFO) << "worker " << worker << " rank " << local_rank
                  << " resumed the job at round " << resumed->round
                  << " from " << checkpoint_path;
    resumed.reset();
  }

  const bool reporter = worker == 0 && leader;
  FILE* progress = nullptr;
  if (reporter)
    progress = std::fopen(ProgressPath(options.run_dir).c_str(), "a");
  RankReport report;
  report.worker = worker;
  report.local_rank = local_rank;
  report.leader = leader;
  report.metric_name =
      task == Task::kFashionMnist ? "test_accuracy" : "val_perplexity";
  double round_loss = 0;
  // Batch, forward and backward of the round's steps: with the optimizer's
  // own compute (gradient averaging, inner step) the whole inner steps.
  absl::Duration round_work;
  const absl::Time train_start = absl::Now();
  absl::Status status = absl::OkStatus();
  // Records the rounds the optimizer closed since the last call. The drain
  // in Finish (no steps) is left out of the curve; final_hash covers it.
  size_t consumed = 0;
  auto record_rounds = [&]() -> absl::Status {
    while (consumed < co2->rounds().size()) {
      const RoundStats& s = co2->rounds()[consumed++];
      if (s.steps == 0) {
        // A heal in Finish's drain: the last round's boundary continued at
        // the round it names (past the job's last, with the final anchor).
        if (s.healed_to && !report.rounds.empty()) {
          report.rounds.back().healed_to = s.healed_to;
          if (s.heal_reason != nullptr) {
            report.rounds.back().heal_reason = s.heal_reason;
          }
        }
        continue;
      }
      if (metrics != nullptr) {
        WorkerRoundSample sample;
        sample.inner_steps = s.steps;
        sample.compute = round_work + s.compute;
        sample.exposed_comm = s.exposed_comm;
        sample.push = s.push;
        sample.bytes_sent = s.bytes_sent;
        sample.anchor_mismatches = s.anchor_mismatches;
        sample.heal_reason = s.heal_reason;
        sample.heal_time = s.heal_time;
        sample.staleness = StalenessOf(algo);
        metrics->ObserveRound(sample);
      }
      RankRound r;
      r.round = s.round;
      r.steps = s.steps;
      r.loss = s.steps > 0 ? round_loss / s.steps : 0;
      round_loss = 0;
      round_work = absl::ZeroDuration();
      r.compute_s = absl::ToDoubleSeconds(s.compute);
      r.exposed_comm_s = absl::ToDoubleSeconds(s.exposed_comm);
      r.boundary_s = absl::ToDoubleSeconds(s.boundary);
      r.bytes_sent = s.bytes_sent;
      r.params_hash = Hex(s.params_hash);
      r.applied_after_steps = s.applied_after_steps;
      r.healed_to = s.healed_to;
      if (s.heal_reason != nullptr) r.heal_reason = s.heal_reason;
      const size_t index = s.round + 1;
      if (leader && options.eval_every > 0 && index % options.eval_every == 0) {
        // The anchor: with eager updates or carried progress a worker's
        // parameters are its own offset from it.
        TaskEval e;
        CO2_RETURN_IF_ERROR(co2->EvaluateAtAnchor([&]() -> absl::Status {
          CO2_ASSIGN_OR_RETURN(e, EvaluateTask(options, data, *model,
                                               options.eval_examples));
          return absl::OkStatus();
        }));
        r.metric = e.metric;
        r.eval_loss = e.loss;
      }
      if (progress != nullptr) {
        std::fprintf(progress, "%zu %lld %.6g %.6g %.6g %.6g\n", index,
                     static_cast<long long>(total_rounds), r.loss, r.metric,
                     absl::ToDoubleSeconds(co2->total_exposed_comm()),
                     absl::ToDoubleSeconds(absl::Now() - train_start));
        std::fflush(progress);
      }
      report.rounds.push_back(std::move(r));
    }
    return absl::OkStatus();
  };
  // A worker that joined a running job starts at the step of its round.
  const int64_t first_step =
      std::min(total_steps, static_cast<int64_t>(co2->round()) * options.tau);
  SkipBatches(options, data, rank, world, 0, first_step);
  for (int64_t step = first_step; step < total_steps && status.ok(); ++step) {
    const absl::Time step_start = absl::Now();
    absl::StatusOr<Batch> batch = NextBatch(options, data, rank, world, step);
    if (!batch.ok()) {
      status = batch.status();
      break;
    }
    const double lr = LearningRate(options, step, total_steps);
    co2->ZeroGrad();
    absl::StatusOr<at::Tensor> loss =
        ComputeLoss(*model, batch->input, batch->target);
    if (!loss.ok()) {
      status = loss.status();
      break;
    }
    try {
      for (auto& group : inner->param_groups()) group.options().set_lr(lr);
      loss->backward();
      const double value = loss->item<double>();
      if (!std::isfinite(value)) {
        status = absl::InternalError(absl::StrCat(
            "training diverged: loss ", value, " at step ", step));
        break;
      }
      round_loss += value;
    } catch (...) {
      status = TorchExceptionToStatus("backward");
      break;
    }
    if (fault.kind == InjectedFault::Kind::kKillInRound &&
        step == std::min(total_steps, (fault.round + 1) * options.tau) - 1) {
      KillSelf(absl::StrCat("in round ", fault.round, " before its boundary"));
    }
    round_work += absl::Now() - step_start;
    if (leave_signalled) co2->RequestLeave();
    status = co2->Step();
    if (status.ok()) status = record_rounds();
    if (co2->left()) {
      CO2_LOG(INFO) << "worker " << worker << " rank " << local_rank
                    << " left the job before round " << co2->round()
                    << " (SIGTERM)";
      report.left_at = co2->round();
      break;
    }
    // A worker that healed continues at the shards' round, from its first
    // step (its inner optimizer state kept).
    const int64_t next =
        std::min(total_steps, static_cast<int64_t>(co2->round()) * options.tau);
    if (status.ok() && next > step + 1) {
      SkipBatches(options, data, rank, world, step + 1, next);
      step = next - 1;
    }
  }
  if (status.ok() && fault.kind == InjectedFault::Kind::kKillBeforeFinish) {
    KillSelf("before Finish");
  }
  if (status.ok()) status = co2->Finish();
  if (status.ok()) status = record_rounds();
  if (status.ok() && fault.kind == InjectedFault::Kind::kKillAfterFinish) {
    KillSelf("after Finish");
  }
  if (status.ok() && fault.kind == InjectedFault::Kind::kFlipFinalBit) {
    uint32_t bits;
    float* x = flat->params().data_ptr<float>();
    std::memcpy(&bits, x, sizeof(bits));
    bits ^= 1;
    std::memcpy(x, &bits, sizeof(bits));
    CO2_LOG(WARNING) << "inject_fault: flipped the lowest bit of parameter 0";
  }
  if (progress != nullptr) std::fclose(progress);
  CO2_RETURN_IF_ERROR(status);
  report.train_s = absl::ToDoubleSeconds(absl::Now() - train_start);

  if (reporter) {
    CO2_ASSIGN_OR_RETURN(TaskEval e, EvaluateTask(options, data, *model,
                                                  options.final_eval_examples));
    if (task == Task::kFashionMnist) {
      report.final_metrics["test_accuracy"] = e.metric;
      report.final_metrics["test_loss"] = e.loss;
    } else {
      report.final_metrics["val_perplexity"] = e.metric;
      report.final_metrics["val_loss"] = e.loss;
    }
  }
  report.steps = static_cast<int64_t>(co2->steps());
  report.exposed_comm_s = absl::ToDoubleSeconds(co2->total_exposed_comm());
  report.bytes_sent = co2->bytes_sent();
  report.final_hash = Hex(co2->ParamsHash());
  const MemoryReport m = co2->Memory();
  report.memory_bytes = {
      {"params", static_cast<double>(m.params)},
      {"grads", static_cast<double>(m.grads)},
      {"anchor", static_cast<double>(m.anchor)},
      {"staging", static_cast<double>(m.staging)},
      {"optimizer_state", static_cast<double>(m.optimizer_state)},
      {"client_buffers", static_cast<double>(m.client_buffers)},
      {"total", static_cast<double>(m.Total())}};
  report.wall_s = absl::ToDoubleSeconds(absl::Now() - started);
  return WriteRankReport(RankReportPath(options.run_dir, worker, local_rank),
                         report);
}

}  // namespace co2::client
