#include "apps/co2-train/trainer.h"

#include <signal.h>
#include <torch/torch.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "apps/co2-train/injected_fault.h"
#include "apps/co2-train/rank_recorder.h"
#include "apps/co2-train/task_data.h"
#include "apps/co2-train/worker_checkpoint.h"
#include "apps/co2-train/worker_model.h"
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
#include "common/layout.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/tls_config.h"

namespace co2::client {

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

namespace {

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


// Where this process stands in the job.
struct WorkerRank {
  int worker = 0;
  int local_rank = 0;
  int rank = 0;   // among every local rank of every worker
  int world = 0;  // workers × local ranks
  bool leader = false;  // local rank 0
};

// What this rank exchanges with the shards (PlanRankSlices): with rank
// slices its own shards and their slice of the model; the leader alone:
// every shard and the whole model (a rank other than the leader: nothing).
struct RankExchange {
  std::optional<common::Range> owned_shards;  // set with slices
  common::Range slice;
  bool sliced() const { return owned_shards.has_value(); }
};

// The node's group (its local ranks) and ddp's group of every rank; null
// where the rank has none.
struct WorkerGroups {
  std::unique_ptr<ProcessGroup> local;
  std::unique_ptr<ProcessGroup> global;
};

// A rank's connection to the shards, with the options it was made with
// (a heal connects again with them); null on ranks that do not exchange.
struct ShardConnection {
  ClientOptions options;
  std::unique_ptr<AggregatorClient> client;
};

// What RunWorker's steps build, in the order they build it; members are
// destroyed in reverse, the optimizer (which borrows the model and the
// groups) first.
struct Worker {
  explicit Worker(const TrainerOptions& o) : options(o) {}

  const TrainerOptions& options;
  WorkerRank rank;
  Task task = Task::kFashionMnist;
  Algo algo = Algo::kCo2;
  InjectedFault fault;  // this process's, or none
  std::string job;
  RankExchange exchange;
  std::unique_ptr<WorkerMetrics> metrics;  // leaders with --metrics_port
  TaskData data;
  int64_t total_steps = 0;
  WorkerModel model;
  WorkerGroups groups;
  std::unique_ptr<Co2Optimizer> co2;
};

int64_t RoundsOf(const TrainerOptions& options, int64_t total_steps) {
  return (total_steps + options.tau - 1) / options.tau;
}

// INVALID_ARGUMENT when (worker, local_rank) is not a rank of the job, or a
// worker the job starts without is not told to join it.
absl::StatusOr<WorkerRank> RankOf(const TrainerOptions& options, int worker,
                                  int local_rank) {
  if (worker < 0 || worker >= options.workers || local_rank < 0 ||
      local_rank >= options.local_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank (", worker, ", ", local_rank, ") outside ",
                     options.workers, " x ", options.local_ranks));
  }
  WorkerRank r;
  r.worker = worker;
  r.local_rank = local_rank;
  r.world = options.workers * options.local_ranks;
  r.rank = worker * options.local_ranks + local_rank;
  r.leader = local_rank == 0;
  const int initial_workers = InitialWorkers(options);
  if (worker >= initial_workers && !options.join && !options.rejoin) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " is not one of the ", initial_workers,
        " workers the job starts with (--scale=", options.scale,
        "): start it with --join"));
  }
  return r;
}

// From here on SIGTERM means, for an aggregator algorithm: leave the job at
// the next boundary (the first one, when it comes before training starts).
// The launcher starts workers with SIGTERM blocked until here.
void TakeLeaveSignal(Algo algo) {
  if (algo != Algo::kDdp) {
    struct sigaction action = {};
    action.sa_handler = OnLeaveSignal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, nullptr);
  }
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_UNBLOCK, &term, nullptr);
}

// The process-wide settings: torch's threads, the leave signal, and the
// fault this process injects (one worker's first process only).
absl::Status SetUpProcess(Worker& w) {
  at::set_num_threads(w.options.threads);
  CO2_ASSIGN_OR_RETURN(w.fault, ParseInjectedFault(w.options.inject_fault));
  TakeLeaveSignal(w.algo);
  if (w.fault.worker != w.rank.worker || w.options.rejoin) {
    w.fault = InjectedFault();
  }
  return absl::OkStatus();
}

// A leader checks the host's TCP settings against the link and serves its
// metrics from the start, before the data loads and the shards answer, so
// that a worker still waiting for them is seen (co2_build_info,
// process_*); the training series appear with the optimizer.
absl::Status StartLeaderServices(Worker& w) {
  if (!w.rank.leader) return absl::OkStatus();
  const TrainerOptions& options = w.options;
  CO2_RETURN_IF_ERROR(common::CheckLinkPathAndLogHostTcp(options.link_path));
  if (options.metrics_port < 0) return absl::OkStatus();
  CO2_ASSIGN_OR_RETURN(
      w.metrics,
      WorkerMetrics::Serve(
          absl::StrCat(options.metrics_host, ":", options.metrics_port), w.job,
          absl::StrCat("worker-", w.rank.worker), options.link_path));
  return absl::OkStatus();
}

absl::Status LoadData(Worker& w) {
  CO2_RETURN_IF_ERROR(LoadTaskData(w.options, w.task, w.rank.rank,
                                   w.rank.world, w.data));
  w.total_steps = TotalSteps(w.options, w.data.steps_per_epoch);
  return absl::OkStatus();
}

// Whether this node's ranks exchange their own slices (--rank_slices), and
// what this rank exchanges. The same decision on every rank of the node: it
// follows from the options and the model alone.
absl::Status PlanRankSlices(Worker& w) {
  const TrainerOptions& options = w.options;
  const size_t p = static_cast<size_t>(w.model.flat->numel());
  w.exchange.slice = common::Range{0, p};
  if (w.algo == Algo::kDdp || options.local_ranks == 1 ||
      options.rank_slices == "off") {
    return absl::OkStatus();
  }
  const size_t shards = options.aggregators.size();
  const size_t ranks = static_cast<size_t>(options.local_ranks);
  absl::Status why = absl::OkStatus();
  common::Range mine;
  for (size_t k = 0; k < ranks && why.ok(); ++k) {
    const absl::StatusOr<common::Range> slice =
        common::RankRange(p, shards, ranks, k);
    if (!slice.ok()) {
      why = slice.status();
    } else if (slice->size() == 0) {
      why = absl::InvalidArgumentError(absl::StrCat(
          "local rank ", k, "'s shards serve none of the model's ", p,
          " parameters (fewer 256 KiB blocks than shards)"));
    } else if (k == static_cast<size_t>(w.rank.local_rank)) {
      mine = *slice;
    }
  }
  if (!why.ok()) {
    if (options.rank_slices == "on") {
      return absl::InvalidArgumentError(
          absl::StrCat("--rank_slices=on: ", why.message()));
    }
    if (w.rank.leader) {
      CO2_LOG(INFO) << "no rank slices (" << why.message()
                    << "): the local leader exchanges the whole model";
    }
    return absl::OkStatus();
  }
  w.exchange.owned_shards =
      common::OwnedShards(shards, ranks, w.rank.local_rank).value();
  w.exchange.slice = mine;
  return absl::OkStatus();
}

// This rank's checkpoint file: the worker's, or with rank slices the rank's.
std::string CheckpointPathOf(const Worker& w) {
  return w.exchange.sliced()
             ? RankCheckpointPath(w.options.checkpoint_dir, w.rank.worker,
                                  w.rank.local_rank)
             : WorkerCheckpointPath(w.options.checkpoint_dir, w.rank.worker);
}

// NOT_FOUND for `path`, saying which flag reads the checkpoint the
// directory holds instead, when it holds one of the other layout.
absl::Status NoCheckpoint(const Worker& w, absl::Status missing) {
  const std::string other =
      w.exchange.sliced()
          ? WorkerCheckpointPath(w.options.checkpoint_dir, w.rank.worker)
          : RankCheckpointPath(w.options.checkpoint_dir, w.rank.worker,
                               w.rank.local_rank);
  std::error_code ec;
  if (!std::filesystem::exists(other, ec)) return missing;
  return absl::FailedPreconditionError(absl::StrCat(
      missing.message(), "; the directory holds ", other, ", written ",
      w.exchange.sliced() ? "by the local leader alone: resume with "
                          "--rank_slices=off"
                        : "with rank slices: resume with rank slices, with "
                          "the --local_ranks and shards it was taken with"));
}

// --resume: the rank's checkpoint, with the inner optimizer's state loaded
// and its slice of the parameters set to the anchor its round starts from
// (its client joins with it); nullopt without --resume.
absl::StatusOr<std::optional<WorkerCheckpoint>> LoadStartPoint(Worker& w) {
  if (!w.options.resume || w.algo == Algo::kDdp) return std::nullopt;
  const std::string path = CheckpointPathOf(w);
  absl::StatusOr<WorkerCheckpoint> loaded =
      LoadWorkerCheckpoint(path, w.job, *w.model.inner);
  if (absl::IsNotFound(loaded.status())) {
    return NoCheckpoint(w, loaded.status());
  }
  CO2_RETURN_IF_ERROR(loaded.status());
  const common::Range slice = w.exchange.slice;
  if (loaded->anchor.size() != slice.size()) {
    return absl::DataLossError(absl::StrCat(
        path, " holds an anchor of ", loaded->anchor.size(),
        " parameters, this rank exchanges ", slice.size(), " (",
        w.exchange.sliced() ? "its slice" : "the whole model", ")"));
  }
  std::copy(loaded->anchor.begin(), loaded->anchor.end(),
            w.model.flat->ParamSpan().begin() + slice.begin);
  return *std::move(loaded);
}

absl::StatusOr<WorkerGroups> JoinGroups(const Worker& w) {
  const TrainerOptions& options = w.options;
  WorkerGroups g;
  if (options.local_ranks > 1) {
    // A restarted node meets under a name of its own: the store still
    // holds the keys of the ranks that died.
    CO2_ASSIGN_OR_RETURN(
        g.local, CreateProcessGroup(MakeGroup(
                     options, w.rank.local_rank, options.local_ranks,
                     absl::StrCat("node-", w.rank.worker, "-",
                                  options.restart))));
  }
  if (w.algo == Algo::kDdp && w.rank.world > 1) {
    CO2_ASSIGN_OR_RETURN(
        g.global,
        CreateProcessGroup(MakeGroup(options, w.rank.rank, w.rank.world,
                                     "global", options.group_address)));
  }
  return g;
}

absl::StatusOr<ClientOptions> MakeClientOptions(
    const Worker& w, const std::optional<WorkerCheckpoint>& resumed) {
  const TrainerOptions& options = w.options;
  ClientOptions c;
  c.addresses = options.aggregators;
  c.job = w.job;
  c.worker_id = absl::StrCat("worker-", w.rank.worker);
  c.owned_shards = w.exchange.owned_shards;
  c.num_parameters = static_cast<uint64_t>(w.model.flat->numel());
  CO2_ASSIGN_OR_RETURN(c.job_config, MakeJobConfig(options, w.algo));
  c.job_config.set_rounds(
      static_cast<uint64_t>(RoundsOf(options, w.total_steps)));
  c.rejoin = options.rejoin;
  if (resumed) c.resume_round = resumed->round;
  CO2_ASSIGN_OR_RETURN(c.uplink_codec, common::ParseCodec(options.codec));
  c.tls.ca_file = options.aggregator_ca;
  c.tls.cert_file = options.aggregator_cert;
  c.tls.key_file = options.aggregator_key;
  if (!options.aggregator_token_file.empty()) {
    CO2_ASSIGN_OR_RETURN(c.token,
                         common::ReadTokenFile(options.aggregator_token_file));
  }
  c.connect_timeout = options.connect_timeout;
  c.reconnect_timeout = options.connect_timeout;
  c.rpc_timeout = std::min(options.connect_timeout, absl::Seconds(30));
  return c;
}

// Every worker joins before anyone pushes round 0, so that all of them are
// required for every round: the rendezvous is the barrier, one for each
// local rank that exchanges (its own shards). A restarted or joining worker
// enters a running job and skips it.
absl::Status AwaitStartingWorkers(const Worker& w) {
  const TrainerOptions& options = w.options;
  const int initial_workers = InitialWorkers(options);
  if (initial_workers <= 1 || options.rejoin || options.join) {
    return absl::OkStatus();
  }
  CO2_ASSIGN_OR_RETURN(
      std::unique_ptr<ProcessGroup> leaders,
      CreateProcessGroup(MakeGroup(
          options, w.rank.worker, initial_workers,
          w.rank.leader ? std::string("leaders")
                        : absl::StrCat("local-rank-", w.rank.local_rank),
          options.group_address)));
  float token = 1;
  return leaders->AllReduceMean(&token, 1);
}

// The leader (with rank slices: every rank) of an aggregator algorithm
// connects to its shards with its anchor, then waits for the other starting
// workers.
absl::StatusOr<ShardConnection> ConnectToShards(
    const Worker& w, const std::optional<WorkerCheckpoint>& resumed) {
  ShardConnection connection;
  if (w.algo == Algo::kDdp || (!w.rank.leader && !w.exchange.sliced())) {
    return connection;
  }
  CO2_ASSIGN_OR_RETURN(connection.options, MakeClientOptions(w, resumed));
  const common::Range slice = w.exchange.slice;
  auto connected = AggregatorClient::Connect(
      connection.options,
      w.model.flat->ParamSpan().subspan(slice.begin, slice.size()));
  if (!connected.ok()) {
    return absl::Status(
        connected.status().code(),
        absl::StrCat("connecting to the aggregator (",
                     absl::StrJoin(w.options.aggregators, ","),
                     "): ", connected.status().message()));
  }
  connection.client = std::move(*connected);
  CO2_RETURN_IF_ERROR(AwaitStartingWorkers(w));
  return connection;
}

absl::StatusOr<Co2OptimizerOptions> MakeOptimizerOptions(const Worker& w) {
  const TrainerOptions& options = w.options;
  Co2OptimizerOptions o;
  o.algo = w.algo;
  o.tau = options.tau;
  o.samples_per_step =
      static_cast<double>(options.batch_size) * options.local_ranks;
  o.update_timeout = options.update_timeout;
  o.push_timeout = options.update_timeout;
  CO2_ASSIGN_OR_RETURN(o.uplink_codec, common::ParseCodec(options.codec));
  o.hash_params = options.hash_params;
  o.verify_final_anchor = options.verify_final_anchor;
  if (RunsEagerUpdates(options)) o.eager_share = 1.0 / options.workers;
  o.carry_progress = options.carry_progress;
  // ValidateTrainerOptions parsed it.
  o.apply = ParseApplyAt(options.apply).value();
  o.apply_by_step = options.apply_by_step;
  o.rounds = static_cast<uint64_t>(RoundsOf(options, w.total_steps));
  return o;
}

// With --heal, a leader the shards cannot take back where it is connects
// again as a rejoining worker, which fetches the shards' anchor.
void OfferHeal(const ShardConnection& connection, Co2OptimizerOptions& o) {
  o.reconnect = RejoinWith(connection.options);
}

// A worker checkpoint (with rank slices: one per rank) at every round
// boundary (TrainerOptions::checkpoint_dir).
void SaveCheckpoints(const Worker& w, Co2OptimizerOptions& o) {
  o.checkpoint_every = 1;
  o.save_checkpoint =
      [path = CheckpointPathOf(w), job = w.job,
       inner = w.model.inner.get()](const WorkerCheckpoint& c) {
        return SaveWorkerCheckpoint(path, job, c, *inner);
      };
}

void InjectDeltaScale(const InjectedFault& fault, Co2Optimizer& co2) {
  CO2_LOG(WARNING) << "inject_fault: the delta of rounds " << fault.round
                   << " to "
                   << (fault.last_round == UINT64_MAX
                           ? std::string("the end")
                           : absl::StrCat(fault.last_round))
                   << " is multiplied by " << kInjectedDeltaScale;
  co2.ScaleDeltasForTesting(kInjectedDeltaScale,
                            static_cast<uint64_t>(fault.round),
                            fault.last_round);
}

// The Co2Optimizer over the model, the groups and the leader's connection;
// a resumed worker starts from its checkpoint's round.
absl::StatusOr<std::unique_ptr<Co2Optimizer>> BuildOptimizer(
    Worker& w, ShardConnection connection,
    const std::optional<WorkerCheckpoint>& resumed) {
  CO2_ASSIGN_OR_RETURN(Co2OptimizerOptions o, MakeOptimizerOptions(w));
  if (connection.client != nullptr && w.options.heal) {
    OfferHeal(connection, o);
  }
  if (!w.options.checkpoint_dir.empty()) SaveCheckpoints(w, o);
  if (resumed) o.resume = &*resumed;
  CO2_ASSIGN_OR_RETURN(
      std::unique_ptr<Co2Optimizer> co2,
      Co2Optimizer::Create(o, w.model.flat.get(), w.model.inner.get(),
                           std::move(connection.client),
                           w.groups.local.get(), w.groups.global.get()));
  if (w.fault.kind == InjectedFault::Kind::kScaleDelta) {
    InjectDeltaScale(w.fault, *co2);
  }
  if (resumed) {
    CO2_LOG(INFO) << "worker " << w.rank.worker << " rank "
                  << w.rank.local_rank << " resumed the job at round "
                  << resumed->round << " from " << CheckpointPathOf(w);
  }
  return co2;
}

// The batch, forward and backward of inner step `step`, at the step's
// learning rate; the loss goes to the recorder. INTERNAL when it diverged.
absl::Status ComputeGradients(Worker& w, int64_t step,
                              RankRecorder& recorder) {
  CO2_ASSIGN_OR_RETURN(
      Batch batch,
      NextBatch(w.options, w.data, w.rank.rank, w.rank.world, step));
  const double lr = LearningRate(w.options, step, w.total_steps);
  w.co2->ZeroGrad();
  CO2_ASSIGN_OR_RETURN(at::Tensor loss,
                       ComputeLoss(*w.model.model, batch.input, batch.target));
  try {
    for (auto& group : w.model.inner->param_groups()) {
      group.options().set_lr(lr);
    }
    loss.backward();
    const double value = loss.item<double>();
    if (!std::isfinite(value)) {
      return absl::InternalError(absl::StrCat("training diverged: loss ",
                                              value, " at step ", step));
    }
    recorder.AddLoss(value);
  } catch (...) {
    return TorchExceptionToStatus("backward");
  }
  return absl::OkStatus();
}

// kill_in_round=R: after the inner steps of round R, before its boundary.
void MaybeKillInRound(const Worker& w, int64_t step) {
  const InjectedFault& fault = w.fault;
  if (fault.kind == InjectedFault::Kind::kKillInRound &&
      step == std::min(w.total_steps, (fault.round + 1) * w.options.tau) - 1) {
    KillSelf(absl::StrCat("in round ", fault.round, " before its boundary"));
  }
}

// The step of the optimizer's round: where a worker that joined a running
// job starts, and where one that healed continues.
int64_t StepOfRound(const Worker& w) {
  return std::min(w.total_steps,
                  static_cast<int64_t>(w.co2->round()) * w.options.tau);
}

// The inner steps from the optimizer's round to the last, or until the
// worker leaves the job (SIGTERM).
absl::Status Train(Worker& w, RankRecorder& recorder) {
  const WorkerRank& r = w.rank;
  const int64_t first_step = StepOfRound(w);
  SkipBatches(w.options, w.data, r.rank, r.world, 0, first_step);
  absl::Status status = absl::OkStatus();
  for (int64_t step = first_step; step < w.total_steps && status.ok();
       ++step) {
    const absl::Time step_start = absl::Now();
    status = ComputeGradients(w, step, recorder);
    if (!status.ok()) break;
    MaybeKillInRound(w, step);
    recorder.AddWork(absl::Now() - step_start);
    if (leave_signalled) w.co2->RequestLeave();
    status = w.co2->Step();
    if (status.ok()) status = recorder.RecordRounds();
    if (w.co2->left()) {
      CO2_LOG(INFO) << "worker " << r.worker << " rank " << r.local_rank
                    << " left the job before round " << w.co2->round()
                    << " (SIGTERM)";
      recorder.RecordLeft(w.co2->round());
      break;
    }
    // A worker that healed continues at the shards' round, from its first
    // step (its inner optimizer state kept).
    const int64_t next = StepOfRound(w);
    if (status.ok() && next > step + 1) {
      SkipBatches(w.options, w.data, r.rank, r.world, step + 1, next);
      step = next - 1;
    }
  }
  return status;
}

// flip_final_bit: one bit of the final model, after the check.
void FlipFinalBit(Worker& w) {
  uint32_t bits;
  float* x = w.model.flat->params().data_ptr<float>();
  std::memcpy(&bits, x, sizeof(bits));
  bits ^= 1;
  std::memcpy(x, &bits, sizeof(bits));
  CO2_LOG(WARNING) << "inject_fault: flipped the lowest bit of parameter 0";
}

// The optimizer's last boundary (the final anchor, applied and checked),
// with the faults injected around it.
absl::Status FinishTraining(Worker& w, RankRecorder& recorder) {
  const InjectedFault::Kind fault = w.fault.kind;
  if (fault == InjectedFault::Kind::kKillBeforeFinish) {
    KillSelf("before Finish");
  }
  CO2_RETURN_IF_ERROR(w.co2->Finish());
  CO2_RETURN_IF_ERROR(recorder.RecordRounds());
  if (fault == InjectedFault::Kind::kKillAfterFinish) KillSelf("after Finish");
  if (fault == InjectedFault::Kind::kFlipFinalBit) FlipFinalBit(w);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWorker(const TrainerOptions& options, int worker,
                       int local_rank) {
  const absl::Time started = absl::Now();
  CO2_RETURN_IF_ERROR(ValidateTrainerOptions(options));
  Worker w(options);
  CO2_ASSIGN_OR_RETURN(w.rank, RankOf(options, worker, local_rank));
  CO2_ASSIGN_OR_RETURN(w.task, ParseTask(options.task));
  CO2_ASSIGN_OR_RETURN(w.algo, ParseAlgo(options.algo));
  w.job = options.job.empty() ? "co2-train" : options.job;
  CO2_RETURN_IF_ERROR(SetUpProcess(w));
  CO2_RETURN_IF_ERROR(StartLeaderServices(w));
  CO2_RETURN_IF_ERROR(LoadData(w));
  CO2_ASSIGN_OR_RETURN(w.model, BuildWorkerModel(options, w.task));
  CO2_RETURN_IF_ERROR(PlanRankSlices(w));
  CO2_ASSIGN_OR_RETURN(std::optional<WorkerCheckpoint> resumed,
                       LoadStartPoint(w));
  CO2_ASSIGN_OR_RETURN(w.groups, JoinGroups(w));
  CO2_ASSIGN_OR_RETURN(ShardConnection shards, ConnectToShards(w, resumed));
  CO2_ASSIGN_OR_RETURN(w.co2, BuildOptimizer(w, std::move(shards), resumed));
  resumed.reset();

  RankSources sources;
  sources.options = &options;
  sources.report_path = RankReportPath(options.run_dir, worker, local_rank);
  sources.progress_path = ProgressPath(options.run_dir);
  sources.task = w.task;
  sources.algo = w.algo;
  sources.co2 = w.co2.get();
  sources.data = &w.data;
  sources.model = w.model.model.get();
  sources.metrics = w.metrics.get();
  RankRecorder recorder(sources, worker, local_rank,
                        RoundsOf(options, w.total_steps));
  CO2_RETURN_IF_ERROR(Train(w, recorder));
  CO2_RETURN_IF_ERROR(FinishTraining(w, recorder));
  return recorder.WriteReport(started);
}

}  // namespace co2::client
