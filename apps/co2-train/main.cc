// co2-train: runs a whole local CO2 (or baseline) experiment from one
// command; see apps/co2-train/launcher.h. The same binary, re-executed with
// --role=worker, is one local rank of one worker (apps/co2-train/trainer.h).
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "apps/co2-train/launcher.h"
#include "apps/co2-train/run_report.h"
#include "apps/co2-train/trainer.h"
#include "client/algo.h"
#include "common/flags_help.h"
#include "common/malloc_settings.h"

ABSL_FLAG(std::string, task, "fashion-mnist", "fashion-mnist | charlm");
ABSL_FLAG(std::string, model, "small",
          "small | wide (fashion-mnist only: a 5.8M-parameter MLP).");
ABSL_FLAG(std::string, algo, "co2", "co2 | ddp | localsgd | slowmo | diloco");
ABSL_FLAG(int, workers, 2, "Workers (nodes); each has its own leader.");
ABSL_FLAG(int, local_ranks, 1, "Processes per worker.");
ABSL_FLAG(std::string, rank_slices, "auto",
          "With --local_ranks > 1: every local rank exchanges its own shards' "
          "slice of the model, so co2's memory and bytes per rank fall as "
          "1/L (docs/sharding.md): auto (where there are at least as many "
          "shards as local ranks, else the leader alone, said in the log) | "
          "on (refuse a job that cannot) | off (the leader alone exchanges "
          "the whole model).");
ABSL_FLAG(int, tau, 8, "Inner steps per round.");
ABSL_FLAG(int, epochs, 0,
          "Passes over each rank's shard (0: unbounded; with --steps=0: 1).");
ABSL_FLAG(int64_t, steps, 0,
          "Inner steps (0: unbounded); the smaller bound wins.");
ABSL_FLAG(uint64_t, seed, 1, "Seeds the model, the data partition and order.");
ABSL_FLAG(std::string, optimizer, "adamw", "Inner optimizer: adamw | sgd.");
ABSL_FLAG(std::optional<double>, lr, std::nullopt,
          "Inner learning rate; unset: the study's best "
          "(docs/results/convergence.md): fashion-mnist 5e-4 for diloco, "
          "2e-3 otherwise; charlm 2e-3 for diloco, 8e-3 otherwise.");
ABSL_FLAG(std::string, lr_schedule, "constant", "constant | cosine");
ABSL_FLAG(double, weight_decay, 0.01, "Inner weight decay.");
ABSL_FLAG(int, batch_size, 32, "Examples per local rank and inner step.");
ABSL_FLAG(int, seq_len, 64, "charlm: characters per training window.");
ABSL_FLAG(std::optional<float>, alpha, std::nullopt,
          "Outer learning rate (docs/outer-settings.md); unset: 1, diloco 0.7.");
ABSL_FLAG(std::optional<float>, beta, std::nullopt,
          "Outer momentum (docs/results/convergence.md; slowmo needs > 0, "
          "e.g. 0.5); unset: 0, diloco 0.9.");
ABSL_FLAG(std::optional<std::string>, momentum, std::nullopt,
          "heavy_ball | nesterov | delayed_nesterov; unset: heavy_ball, "
          "diloco nesterov.");
ABSL_FLAG(std::optional<uint32_t>, momentum_period, std::nullopt,
          "delayed_nesterov: rounds between momentum steps; unset: 4.");
ABSL_FLAG(bool, eager, false,
          "co2: each worker starts a round from the anchor plus the eager "
          "update of its own latest delta (docs/algorithm.md), in place of "
          "carried progress; the synchronous algorithms have no stale "
          "average to make up for.");
ABSL_FLAG(bool, carry_progress, true,
          "co2: until the update made from a round's mean is applied, the "
          "next round runs from where the worker's own delta would take the "
          "anchor, not from the anchor (docs/algorithm.md, \"Carried "
          "progress\"); --eager takes its place, and the synchronous "
          "algorithms have no stale average to stand in for.");
ABSL_FLAG(std::optional<std::string>, apply, std::nullopt,
          "co2: when a worker applies the update a round owes: arrival (after "
          "the inner step it has arrived by, keeping the steps taken; "
          "docs/algorithm.md) | boundary (at the end of the round it arrives "
          "in); unset: arrival, boundary with --deterministic and for the "
          "other algorithms.");
ABSL_FLAG(int, apply_by_step, 0,
          "co2 with --apply=arrival: the inner step of a round by which a "
          "worker applies the update it owes at the latest, waiting for it "
          "there if it has not arrived (docs/algorithm.md); 0: it waits only "
          "at the boundary. At most --tau - 1.");
ABSL_FLAG(std::string, gap_penalty, "none", "none | constant | gap_aware");
ABSL_FLAG(float, penalty_lambda, 1.0f, "λ of --gap_penalty=constant.");
ABSL_FLAG(std::string, clip, "none",
          "Outer momentum clipping: none | value | adaptive");
ABSL_FLAG(float, clip_value, 3.0f, "φ (value) or k (adaptive).");
ABSL_FLAG(std::string, codec, "fp32", "Uplink codec: fp32 | bf16 | int8");
ABSL_FLAG(std::string, downlink_codec, "fp32",
          "Downlink codec: fp32 | bf16 | int8");
ABSL_FLAG(
    std::vector<std::string>, aggregators, {},
    "host:port of each aggregator shard; empty: start --shards embedded.");
ABSL_FLAG(int, shards, 1, "Embedded aggregator shards.");
ABSL_FLAG(std::string, aggregator_ca, "",
          "PEM CA that signed the --aggregators' certificates (TLS).");
ABSL_FLAG(std::string, aggregator_cert, "",
          "This worker's PEM certificate for mTLS (with --aggregator_key).");
ABSL_FLAG(std::string, aggregator_key, "", "PEM key of --aggregator_cert.");
ABSL_FLAG(std::string, aggregator_token_file, "",
          "File holding the job's bearer token for the --aggregators.");
ABSL_FLAG(std::string, job, "", "Job name (default: unique per run).");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Fashion-MNIST idx.gz directory.");
ABSL_FLAG(std::string, corpus_dir, "/usr/share/games/fortunes",
          "Fortunes directory.");
ABSL_FLAG(int, eval_every, 10,
          "Rounds between evaluations (0: only at the end).");
ABSL_FLAG(int64_t, eval_examples, 1000, "Examples (windows) per periodic evaluation.");
ABSL_FLAG(int64_t, final_eval_examples, 0, "Examples at the end (0: all).");
ABSL_FLAG(int, threads, 1, "Torch threads per process.");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(30),
          "Joining the aggregator (also its reconnects).");
ABSL_FLAG(absl::Duration, update_timeout, absl::Minutes(5),
          "Longest wait for one outer update.");
ABSL_FLAG(absl::Duration, group_timeout, absl::Minutes(2),
          "Rendezvous and collectives of the process groups.");
ABSL_FLAG(std::string, group_address, "127.0.0.1",
          "This rank's IPv4 address in the groups spanning workers (ddp, the "
          "leaders' barrier): set it when workers run on other hosts or "
          "network namespaces (bench/overlap).");
ABSL_FLAG(absl::Duration, round_timeout, absl::Seconds(60),
          "Embedded shards: round deadline for a quorum close.");
ABSL_FLAG(bool, deterministic, false,
          "The shards sum each round exactly, so that two runs with the same "
          "seed and settings end with the same bits (JobConfig.deterministic: "
          "16 bytes of shard memory per parameter instead of 4).");
ABSL_FLAG(float, outlier_ratio, co2::common::kDefaultOutlierRatio,
          "k of the shards' outlier rule: a contribution whose norm is more "
          "than k x the median of its chunk's is held out of the mean "
          "(JobConfig.outlier_ratio; 0: off).");
ABSL_FLAG(bool, hash_params, true,
          "Hash the parameters after every round to check that all ranks agree "
          "(one pass over the model per round).");
ABSL_FLAG(bool, verify_final_anchor, true,
          "Each worker checks its final model against the shards' anchor at "
          "the end and fails if it differs (one download of the model).");
ABSL_FLAG(std::string, inject_fault, "",
          "Testing (the fault suite): WORKER:WHAT fails that worker's first "
          "process at one point; WHAT is kill_in_round=R, kill_before_finish, "
          "kill_after_finish, flip_final_bit or scale_delta=A-B "
          "(apps/co2-train/injected_fault.h).");
ABSL_FLAG(std::string, report, "", "Write the JSON report here.");
ABSL_FLAG(std::string, run_dir, "", "Scratch directory (default: a fresh one in /tmp).");
ABSL_FLAG(bool, progress, true, "Show the one-line progress display.");
ABSL_FLAG(bool, keep_run_dir, false, "Keep the scratch directory and logs.");
ABSL_FLAG(int, metrics_port, -1,
          "Worker leaders serve /metrics on this port + their worker index "
          "when the launcher starts them, on this port when started with "
          "--role=worker (0: free ports; -1: off).");
ABSL_FLAG(double, link_mbit, 0,
          "The rate of each worker's path to the shards, Mbit/s (0: not "
          "said). With --link_rtt each worker leader logs at start whether "
          "the host's TCP settings let one stream fill it.");
ABSL_FLAG(absl::Duration, link_rtt, absl::ZeroDuration(),
          "The round trip of that path (e.g. 100ms; 0: not said).");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0",
          "The address worker /metrics listen on (127.0.0.1: this host only).");
ABSL_FLAG(std::string, role, "launcher", "Internal: launcher | worker.");
ABSL_FLAG(int, worker, 0, "Internal: this process's worker.");
ABSL_FLAG(int, local_rank, 0, "Internal: this process's local rank.");
ABSL_FLAG(int, max_restarts, 0,
          "Restart a worker whose process dies (all its local ranks), up to "
          "this many times per worker; it rejoins the running job (not with "
          "ddp).");
ABSL_FLAG(std::string, scale, "",
          "Grow and shrink the job: ROUND:COUNT,... (e.g. 0:2,20:4,40:3): "
          "from ROUND on, workers 0 .. COUNT-1 take part; the launcher starts "
          "workers into the running job and stops the highest-numbered ones "
          "with SIGTERM (not with ddp). --workers is the most there are.");
ABSL_FLAG(bool, join, false,
          "With --role=worker: this worker joins a running job as a new "
          "member (docs/reliability.md): it skips the start barrier, fetches "
          "the anchor and trains from the round the shards are in. Any "
          "worker leaves the job cleanly on SIGTERM, at its next boundary.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Save each worker's state at every round boundary here (and the "
          "embedded shards' checkpoints and the job's name), so that --resume "
          "continues the job after every process stopped.");
ABSL_FLAG(bool, resume, false,
          "Continue the job of --checkpoint_dir: every worker joins at the "
          "round of its checkpoint with its saved state; the run ends with "
          "the bits it would have had without stopping.");
ABSL_FLAG(bool, heal, true,
          "A worker the shards cannot take back where it is (too far behind, "
          "a stale contribution, dropped after its lease) fetches their "
          "anchor and continues at their round in the same process.");
ABSL_FLAG(int, restart, 0,
          "Internal: how many times the launcher restarted this worker.");
ABSL_FLAG(bool, rejoin, false,
          "With --role=worker: this worker restarts into a running job "
          "(docs/reliability.md): it skips the start barrier and trains from "
          "the round the shards are in.");

namespace {

co2::client::TrainerOptions ReadOptions() {
  co2::client::TrainerOptions o;
  o.task = absl::GetFlag(FLAGS_task);
  o.model = absl::GetFlag(FLAGS_model);
  o.algo = absl::GetFlag(FLAGS_algo);
  o.workers = absl::GetFlag(FLAGS_workers);
  o.local_ranks = absl::GetFlag(FLAGS_local_ranks);
  o.rank_slices = absl::GetFlag(FLAGS_rank_slices);
  o.tau = absl::GetFlag(FLAGS_tau);
  o.epochs = absl::GetFlag(FLAGS_epochs);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.eager = absl::GetFlag(FLAGS_eager);
  o.lr = absl::GetFlag(FLAGS_lr).value_or(
      co2::client::DefaultLearningRate(o.task, o.algo));
  o.lr_schedule = absl::GetFlag(FLAGS_lr_schedule);
  o.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  // Unset outer settings take the algorithm's own defaults (diloco's α, β
  // and Nesterov momentum); a bad --algo is reported by the trainer.
  const absl::StatusOr<co2::client::Algo> algo = co2::client::ParseAlgo(o.algo);
  const co2::client::Algo outer_algo =
      algo.ok() ? *algo : co2::client::Algo::kCo2;
  const co2::client::OuterDefaults outer =
      co2::client::OuterDefaultsOf(outer_algo);
  o.alpha = absl::GetFlag(FLAGS_alpha).value_or(outer.alpha);
  o.beta = absl::GetFlag(FLAGS_beta).value_or(outer.beta);
  o.momentum =
      absl::GetFlag(FLAGS_momentum)
          .value_or(outer_algo == co2::client::Algo::kDiLoCo ? "nesterov"
                                                             : "heavy_ball");
  o.momentum_period = absl::GetFlag(FLAGS_momentum_period)
                          .value_or(o.momentum == "delayed_nesterov"
                                        ? co2::client::kDefaultMomentumPeriod
                                        : 0);
  o.gap_penalty = absl::GetFlag(FLAGS_gap_penalty);
  o.penalty_lambda = absl::GetFlag(FLAGS_penalty_lambda);
  o.clip = absl::GetFlag(FLAGS_clip);
  o.clip_value = absl::GetFlag(FLAGS_clip_value);
  o.codec = absl::GetFlag(FLAGS_codec);
  o.downlink_codec = absl::GetFlag(FLAGS_downlink_codec);
  o.aggregators = absl::GetFlag(FLAGS_aggregators);
  o.shards = absl::GetFlag(FLAGS_shards);
  o.aggregator_ca = absl::GetFlag(FLAGS_aggregator_ca);
  o.aggregator_cert = absl::GetFlag(FLAGS_aggregator_cert);
  o.aggregator_key = absl::GetFlag(FLAGS_aggregator_key);
  o.aggregator_token_file = absl::GetFlag(FLAGS_aggregator_token_file);
  o.job = absl::GetFlag(FLAGS_job);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.corpus_dir = absl::GetFlag(FLAGS_corpus_dir);
  o.eval_every = absl::GetFlag(FLAGS_eval_every);
  o.eval_examples = absl::GetFlag(FLAGS_eval_examples);
  o.final_eval_examples = absl::GetFlag(FLAGS_final_eval_examples);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  o.update_timeout = absl::GetFlag(FLAGS_update_timeout);
  o.group_timeout = absl::GetFlag(FLAGS_group_timeout);
  o.group_address = absl::GetFlag(FLAGS_group_address);
  o.hash_params = absl::GetFlag(FLAGS_hash_params);
  o.deterministic = absl::GetFlag(FLAGS_deterministic);
  o.outlier_ratio = absl::GetFlag(FLAGS_outlier_ratio);
  o.carry_progress =
      absl::GetFlag(FLAGS_carry_progress) &&
      co2::client::DefaultCarryProgress(outer_algo, o.eager);
  o.apply = absl::GetFlag(FLAGS_apply).value_or(std::string(
      co2::client::ApplyAtName(co2::client::DefaultApplyAt(outer_algo,
                                                           o.deterministic))));
  o.apply_by_step = absl::GetFlag(FLAGS_apply_by_step);
  o.verify_final_anchor = absl::GetFlag(FLAGS_verify_final_anchor);
  o.inject_fault = absl::GetFlag(FLAGS_inject_fault);
  o.round_timeout = absl::GetFlag(FLAGS_round_timeout);
  o.report = absl::GetFlag(FLAGS_report);
  o.run_dir = absl::GetFlag(FLAGS_run_dir);
  o.progress = absl::GetFlag(FLAGS_progress);
  o.keep_run_dir = absl::GetFlag(FLAGS_keep_run_dir);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  o.link_path = {absl::GetFlag(FLAGS_link_mbit) * 1e6,
                 absl::GetFlag(FLAGS_link_rtt)};
  o.rejoin = absl::GetFlag(FLAGS_rejoin);
  o.join = absl::GetFlag(FLAGS_join);
  o.scale = absl::GetFlag(FLAGS_scale);
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.resume = absl::GetFlag(FLAGS_resume);
  o.restart = absl::GetFlag(FLAGS_restart);
  o.heal = absl::GetFlag(FLAGS_heal);
  o.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  return o;
}

// A worker started on its own (a container, a Kubernetes pod) has no
// launcher to summarise the run, and its logs are all its operator sees:
// one line with what its rank report holds.
void PrintWorkerResult(const std::string& run_dir, int worker, int local_rank) {
  const absl::StatusOr<co2::client::RankReport> report =
      co2::client::ReadRankReport(
          co2::client::RankReportPath(run_dir, worker, local_rank));
  if (!report.ok()) return;
  std::printf("co2-train worker %d rank %d: done: %lld steps in %.1f s, "
              "exposed communication %.2f s, final model %s",
              worker, local_rank, static_cast<long long>(report->steps),
              report->train_s, report->exposed_comm_s,
              report->final_hash.c_str());
  for (const auto& [name, value] : report->final_metrics) {
    std::printf(", final %s %.4f", name.c_str(), value);
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread. Every inner step allocates and frees LibTorch's
  // activations and gradients (16 MiB for a 2048 x 2048 layer); with glibc's
  // defaults each was fresh pages, and the wide model's CPU step took 1.3 x
  // as long (docs/performance.md, section 1).
  co2::common::KeepLargeBuffersInHeap();
  co2::common::SetUpFlagsHelp(
      __FILE__,
      "trains a model with CO2 (or ddp, localsgd, slowmo, diloco) on worker "
      "processes it starts.\n"
      "  co2-train --task=fashion-mnist --algo=co2 --workers=4 --tau=8 "
      "--epochs=1 --report=run.json",
      argc, argv);
  const std::vector<std::string> args(argv + 1, argv + argc);
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr, "co2-train: error: unexpected argument '%s'\n",
                 positional[1]);
    return 2;
  }
  const co2::client::TrainerOptions options = ReadOptions();
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "worker") {
    const int worker = absl::GetFlag(FLAGS_worker);
    const int local_rank = absl::GetFlag(FLAGS_local_rank);
    const absl::Status status =
        co2::client::RunWorker(options, worker, local_rank);
    if (!status.ok()) {
      std::fprintf(stderr, "co2-train worker %d rank %d: error: %s\n", worker,
                   local_rank, status.ToString().c_str());
      return 1;
    }
    PrintWorkerResult(options.run_dir, worker, local_rank);
    return 0;
  }
  if (role != "launcher") {
    std::fprintf(stderr, "co2-train: error: --role must be launcher or worker, got '%s'\n",
                 role.c_str());
    return 2;
  }
  co2::client::LaunchOptions launch;
  launch.trainer = options;
  launch.args = args;
  const absl::Status status = co2::client::RunLauncher(launch);
  if (!status.ok()) {
    std::fprintf(stderr, "co2-train: error: %s\n", status.ToString().c_str());
    return status.code() == absl::StatusCode::kCancelled ? 130 : 1;
  }
  return 0;
}
