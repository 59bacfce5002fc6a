#include "client/trainer.h"

#include <signal.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/aggregator_client.h"
#include "client/batches.h"
#include "client/char_corpus.h"
#include "client/co2_optimizer.h"
#include "client/fashion_mnist.h"
#include "client/flat_params.h"
#include "client/models.h"
#include "client/process_group.h"
#include "client/run_report.h"
#include "client/task_data.h"
#include "client/torch_status.h"
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
    const TrainerOptions& o, const std::vector<torch::Tensor>& params) {
  try {
    if (o.optimizer == "sgd") {
      return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::SGD(
          params, torch::optim::SGDOptions(o.lr).momentum(0.9).weight_decay(
                      o.weight_decay)));
    }
    return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::AdamW(
        params, torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay)));
  } catch (...) {
    return TorchExceptionToStatus("inner optimizer");
  }
}

double LearningRate(const TrainerOptions& o, int64_t step, int64_t total) {
  if (o.lr_schedule != "cosine" || total <= 1) return o.lr;
  const double progress = static_cast<double>(step) / (total - 1);
  return 0.5 * o.lr * (1.0 + std::cos(M_PI * progress));
}

absl::StatusOr<v1::JobConfig> MakeJobConfig(const TrainerOptions& o,
                                            Algo algo) {
  v1::JobConfig c = common::DefaultJobConfig(0, 0);
  c.set_alpha(o.alpha);
  c.set_beta(o.beta);
  CO2_ASSIGN_OR_RETURN(v1::Momentum momentum, common::ParseMomentum(o.momentum));
  c.set_momentum(momentum);
  CO2_ASSIGN_OR_RETURN(v1::GapPenalty penalty,
                       common::ParseGapPenalty(o.gap_penalty));
  c.set_gap_penalty(penalty);
  c.set_penalty_lambda(o.penalty_lambda);
  CO2_ASSIGN_OR_RETURN(v1::Clip clip, common::ParseClip(o.clip));
  c.set_clip(clip);
  c.set_clip_value(o.clip_value);
  CO2_ASSIGN_OR_RETURN(common::Codec down, common::ParseCodec(o.downlink_codec));
  c.set_downlink_codec(static_cast<v1::Codec>(down));
  c.set_tau(o.tau);
  c.set_round_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(o.round_timeout)));
  ApplyAlgo(algo, c);
  return c;
}

std::string Hex(uint64_t h) { return absl::StrFormat("%016x", h); }

GroupOptions MakeGroup(const TrainerOptions& o, int rank, int size,
                       const std::string& prefix,
                       const std::string& address = "127.0.0.1") {
  GroupOptions g;
  g.backend = Backend::kGloo;
  g.rank = rank;
  g.size = size;
  g.store_dir = absl::StrCat(o.run_dir, "/store");
  g.prefix = prefix;
  g.timeout = o.group_timeout;
  g.address = address;
  return g;
}

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
  } else {
    return Bad("inject_fault",
               absl::StrCat("unknown fault in '", spec,
                            "' (kill_in_round=R, kill_before_finish, "
                            "kill_after_finish, flip_final_bit)"));
  }
  return f;
}

absl::Status ValidateTrainerOptions(const TrainerOptions& o) {
  CO2_ASSIGN_OR_RETURN(Task task, ParseTask(o.task));
  CO2_ASSIGN_OR_RETURN(ModelSize size, ParseModelSize(o.model));
  if (task == Task::kCharLm && size == ModelSize::kWide) {
    return Bad("model", "wide is for --task=fashion-mnist only");
  }
  CO2_RETURN_IF_ERROR(ParseAlgo(o.algo).status());
  if (o.workers < 1) return Bad("workers", absl::StrCat("must be >= 1, got ", o.workers));
  if (o.local_ranks < 1) {
    return Bad("local_ranks", absl::StrCat("must be >= 1, got ", o.local_ranks));
  }
  if (o.tau < 1) return Bad("tau", absl::StrCat("must be >= 1, got ", o.tau));
  if (o.epochs < 0) return Bad("epochs", absl::StrCat("must be >= 0, got ", o.epochs));
  if (o.steps < 0) return Bad("steps", absl::StrCat("must be >= 0, got ", o.steps));
  if (o.optimizer != "adamw" && o.optimizer != "sgd") {
    return Bad("optimizer", absl::StrCat("must be adamw or sgd, got '", o.optimizer, "'"));
  }
  if (!(o.lr > 0) || !std::isfinite(o.lr)) {
    return Bad("lr", absl::StrCat("must be > 0, got ", o.lr));
  }
  if (o.lr_schedule != "constant" && o.lr_schedule != "cosine") {
    return Bad("lr_schedule",
               absl::StrCat("must be constant or cosine, got '", o.lr_schedule, "'"));
  }
  if (o.batch_size < 1) {
    return Bad("batch_size", absl::StrCat("must be >= 1, got ", o.batch_size));
  }
  if (o.seq_len < 1) return Bad("seq_len", absl::StrCat("must be >= 1, got ", o.seq_len));
  if (o.shards < 1) return Bad("shards", absl::StrCat("must be >= 1, got ", o.shards));
  if (o.eval_every < 0) {
    return Bad("eval_every", absl::StrCat("must be >= 0, got ", o.eval_every));
  }
  if (o.threads < 1) return Bad("threads", absl::StrCat("must be >= 1, got ", o.threads));
  if (o.max_restarts < 0) {
    return Bad("max_restarts", absl::StrCat("must be >= 0, got ", o.max_restarts));
  }
  if (o.max_restarts > 0 && (o.algo == "ddp" || o.local_ranks > 1)) {
    return Bad("max_restarts",
               "needs an aggregator algorithm (not ddp) and --local_ranks=1: "
               "a worker restarts alone into the running job");
  }
  if (o.aggregators.empty() &&
      !(o.aggregator_ca + o.aggregator_cert + o.aggregator_key +
        o.aggregator_token_file)
           .empty()) {
    return Bad("aggregator_ca",
               "and the other --aggregator_* TLS flags are for external "
               "shards (--aggregators); embedded shards are plaintext");
  }
  CO2_RETURN_IF_ERROR(common::ParseCodec(o.codec).status());
  CO2_RETURN_IF_ERROR(ParseInjectedFault(o.inject_fault).status());
  CO2_ASSIGN_OR_RETURN(Algo algo, ParseAlgo(o.algo));
  CO2_ASSIGN_OR_RETURN(v1::JobConfig config, MakeJobConfig(o, algo));
  config.set_num_parameters(1);
  config.set_num_shards(1);
  return common::ValidateJobConfig(config);
}

absl::Status CheckDataset(const TrainerOptions& o) {
  CO2_ASSIGN_OR_RETURN(Task task, ParseTask(o.task));
  if (task == Task::kFashionMnist) {
    FashionMnistOptions fo;
    fo.directory = o.data_dir;
    return LoadFashionMnist(fo).status();
  }
  CharCorpusOptions co;
  co.directory = o.corpus_dir;
  return CharCorpus::Load(co).status();
}

std::string RankReportPath(const std::string& run_dir, int worker,
                           int local_rank) {
  return absl::StrCat(run_dir, "/rank-", worker, "-", local_rank, ".json");
}

std::string ProgressPath(const std::string& run_dir) {
  return absl::StrCat(run_dir, "/progress.txt");
}

absl::Status RunWorker(const TrainerOptions& o, int worker, int local_rank) {
  const absl::Time started = absl::Now();
  CO2_RETURN_IF_ERROR(ValidateTrainerOptions(o));
  if (worker < 0 || worker >= o.workers || local_rank < 0 ||
      local_rank >= o.local_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank (", worker, ", ", local_rank, ") outside ", o.workers, " x ",
        o.local_ranks));
  }
  CO2_ASSIGN_OR_RETURN(Task task, ParseTask(o.task));
  CO2_ASSIGN_OR_RETURN(Algo algo, ParseAlgo(o.algo));
  const int world = o.workers * o.local_ranks;
  const int rank = worker * o.local_ranks + local_rank;
  const bool leader = local_rank == 0;
  at::set_num_threads(o.threads);
  CO2_ASSIGN_OR_RETURN(InjectedFault fault, ParseInjectedFault(o.inject_fault));
  if (fault.worker != worker || o.rejoin) fault = InjectedFault();

  // Served from the start, before the data loads and the shards answer, so
  // that a worker still waiting for them is seen (co2_build_info,
  // process_*); the training series appear with the optimizer.
  std::unique_ptr<WorkerMetrics> metrics;  // leaders with --metrics_port
  if (leader && o.metrics_port >= 0) {
    CO2_ASSIGN_OR_RETURN(
        metrics, WorkerMetrics::Serve(
                     absl::StrCat(o.metrics_host, ":", o.metrics_port),
                     o.job.empty() ? "co2-train" : o.job,
                     absl::StrCat("worker-", worker)));
  }

  TaskData data;
  CO2_RETURN_IF_ERROR(LoadTaskData(o, task, rank, world, data));
  const int64_t total_steps = TotalSteps(o, data.steps_per_epoch);

  ModelOptions mo;
  mo.seed = o.seed;
  CO2_ASSIGN_OR_RETURN(mo.size, ParseModelSize(o.model));
  CO2_ASSIGN_OR_RETURN(std::shared_ptr<TaskModel> model, MakeModel(task, mo));
  model->train();
  CO2_ASSIGN_OR_RETURN(std::unique_ptr<FlatParams> flat,
                       FlatParams::Create(model->parameters()));
  CO2_ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> inner,
                       MakeInner(o, model->parameters()));

  std::unique_ptr<ProcessGroup> local, global;
  if (o.local_ranks > 1) {
    CO2_ASSIGN_OR_RETURN(
        local, CreateProcessGroup(MakeGroup(o, local_rank, o.local_ranks,
                                            absl::StrCat("node-", worker))));
  }
  if (algo == Algo::kDdp && world > 1) {
    CO2_ASSIGN_OR_RETURN(
        global, CreateProcessGroup(
                    MakeGroup(o, rank, world, "global", o.group_address)));
  }
  CO2_ASSIGN_OR_RETURN(common::Codec uplink, common::ParseCodec(o.codec));
  std::unique_ptr<AggregatorClient> client;
  if (algo != Algo::kDdp && leader) {
    ClientOptions co;
    co.addresses = o.aggregators;
    co.job = o.job.empty() ? "co2-train" : o.job;
    co.worker_id = absl::StrCat("worker-", worker);
    CO2_ASSIGN_OR_RETURN(co.job_config, MakeJobConfig(o, algo));
    co.job_config.set_rounds(
        static_cast<uint64_t>((total_steps + o.tau - 1) / o.tau));
    co.rejoin = o.rejoin;
    co.uplink_codec = uplink;
    co.tls.ca_file = o.aggregator_ca;
    co.tls.cert_file = o.aggregator_cert;
    co.tls.key_file = o.aggregator_key;
    if (!o.aggregator_token_file.empty()) {
      CO2_ASSIGN_OR_RETURN(co.token,
                           common::ReadTokenFile(o.aggregator_token_file));
    }
    co.connect_timeout = o.connect_timeout;
    co.reconnect_timeout = o.connect_timeout;
    co.rpc_timeout = std::min(o.connect_timeout, absl::Seconds(30));
    auto connected = AggregatorClient::Connect(co, flat->ParamSpan());
    if (!connected.ok()) {
      return absl::Status(
          connected.status().code(),
          absl::StrCat("connecting to the aggregator (",
                       absl::StrJoin(o.aggregators, ","),
                       "): ", connected.status().message()));
    }
    client = std::move(*connected);
    if (o.workers > 1 && !o.rejoin) {
      // Every worker joins before anyone pushes round 0, so that all of them
      // are required for every round: the rendezvous is the barrier. A
      // restarted worker joins a running job and skips it.
      CO2_ASSIGN_OR_RETURN(
          std::unique_ptr<ProcessGroup> leaders,
          CreateProcessGroup(
              MakeGroup(o, worker, o.workers, "leaders", o.group_address)));
      float token = 1;
      CO2_RETURN_IF_ERROR(leaders->AllReduceMean(&token, 1));
    }
  }

  Co2OptimizerOptions opts;
  opts.algo = algo;
  opts.tau = o.tau;
  opts.samples_per_step = static_cast<double>(o.batch_size) * o.local_ranks;
  opts.update_timeout = o.update_timeout;
  opts.push_timeout = o.update_timeout;
  opts.uplink_codec = uplink;
  opts.hash_params = o.hash_params;
  opts.verify_final_anchor = o.verify_final_anchor;
  const int64_t total_rounds = (total_steps + o.tau - 1) / o.tau;
  opts.rounds = static_cast<uint64_t>(total_rounds);
  CO2_ASSIGN_OR_RETURN(
      std::unique_ptr<Co2Optimizer> co2,
      Co2Optimizer::Create(opts, flat.get(), inner.get(), std::move(client),
                           local.get(), global.get()));

  const bool reporter = worker == 0 && leader;
  FILE* progress = nullptr;
  if (reporter) progress = std::fopen(ProgressPath(o.run_dir).c_str(), "a");
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
      if (s.steps == 0) continue;
      if (metrics != nullptr) {
        WorkerRoundSample sample;
        sample.inner_steps = s.steps;
        sample.compute = round_work + s.compute;
        sample.exposed_comm = s.exposed_comm;
        sample.push = s.push;
        sample.bytes_sent = s.bytes_sent;
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
      const size_t index = s.round + 1;
      if (leader && o.eval_every > 0 && index % o.eval_every == 0) {
        CO2_ASSIGN_OR_RETURN(TaskEval e, EvaluateTask(o, data, *model, o.eval_examples));
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
      std::min(total_steps, static_cast<int64_t>(co2->round()) * o.tau);
  SkipBatches(o, data, rank, world, first_step);
  for (int64_t step = first_step; step < total_steps && status.ok(); ++step) {
    const absl::Time step_start = absl::Now();
    absl::StatusOr<Batch> batch = NextBatch(o, data, rank, world, step);
    if (!batch.ok()) {
      status = batch.status();
      break;
    }
    const double lr = LearningRate(o, step, total_steps);
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
        step == std::min(total_steps, (fault.round + 1) * o.tau) - 1) {
      KillSelf(absl::StrCat("in round ", fault.round, " before its boundary"));
    }
    round_work += absl::Now() - step_start;
    status = co2->Step();
    if (status.ok()) status = record_rounds();
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
    CO2_ASSIGN_OR_RETURN(TaskEval e,
                         EvaluateTask(o, data, *model, o.final_eval_examples));
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
  return WriteRankReport(RankReportPath(o.run_dir, worker, local_rank), report);
}

}  // namespace co2::client
