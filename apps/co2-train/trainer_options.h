// TrainerOptions: everything one rank of co2-train derives its run from,
// the checks of their ranges and names, and what follows from them (the
// workers a scaled job starts with, the job's outer-step settings, the
// default learning rate). Every rank derives everything from these options
// alone, so no rank ever needs another's configuration. Torch-free header;
// pure functions, any thread.
#ifndef CO2_APPS_CO2_TRAIN_TRAINER_OPTIONS_H_
#define CO2_APPS_CO2_TRAIN_TRAINER_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/algo.h"
#include "common/host_tcp.h"
#include "common/job_config.h"

namespace co2::client {

struct TrainerOptions {
  std::string task = "fashion-mnist";  // fashion-mnist | charlm
  std::string model = "small";         // small | wide (models.h)
  std::string algo = "co2";            // co2 | ddp | localsgd | slowmo | diloco
  int workers = 2;                     // W: nodes, each with its own leader
  int local_ranks = 1;                 // L: processes per worker
  // With L > 1 and an aggregator algorithm, whether every local rank
  // exchanges its own shards' slice (common::OwnedShards): "auto" where the
  // shards allow it (S >= L and no rank's slice empty), else the leader
  // alone with a log line; "on" refuses a job that cannot; "off": the
  // leader alone exchanges the whole model.
  std::string rank_slices = "auto";
  int tau = 8;                         // inner steps per round
  // The run ends after `epochs` passes over each rank's shard or `steps`
  // inner steps, whichever comes first (0 = no bound; both 0: one epoch).
  int epochs = 0;
  int64_t steps = 0;
  uint64_t seed = 1;
  std::string optimizer = "adamw";  // adamw | sgd (momentum 0.9)
  double lr = 1e-3;
  std::string lr_schedule = "constant";  // constant | cosine
  double weight_decay = 0.01;
  int batch_size = 32;  // per local rank and inner step
  int seq_len = 64;     // charlm window length
  // Outer step (JobConfig). localsgd forces α=1, β=0, no penalty, no clip;
  // slowmo forces no penalty and no clip.
  float alpha = 1.0f;  // docs/outer-settings.md
  float beta = 0.0f;
  // heavy_ball | nesterov | delayed_nesterov
  std::string momentum = "heavy_ball";
  uint32_t momentum_period = 0;         // N of delayed_nesterov (0 otherwise)
  std::string gap_penalty = "none";     // none | constant | gap_aware
  float penalty_lambda = 1.0f;          // for gap_penalty=constant
  std::string clip = "none";            // none | value | adaptive
  float clip_value = 3.0f;              // φ (value) or k (adaptive)
  std::string codec = "fp32";           // uplink: fp32 | bf16 | int8
  std::string downlink_codec = "fp32";
  // Aggregator shards host:port, in shard order. Empty: the launcher starts
  // `shards` embedded shards and fills this in for the workers.
  std::vector<std::string> aggregators;
  // TLS to external shards (with `aggregators` only; embedded shards are
  // plaintext on 127.0.0.1): the CA that signed the shards' certificates,
  // this worker's certificate and key for mTLS, and a file holding the job's
  // bearer token (docs/reliability.md).
  std::string aggregator_ca;
  std::string aggregator_cert;
  std::string aggregator_key;
  std::string aggregator_token_file;
  int shards = 1;
  std::string job;                     // job name (launcher picks a unique one)
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string corpus_dir = "/usr/share/games/fortunes";
  int eval_every = 10;                 // rounds between evaluations (0: end only)
  int64_t eval_examples = 1000;        // examples/windows per periodic eval
  int64_t final_eval_examples = 0;     // at the end (0: the whole split)
  int threads = 1;                     // torch intra-op threads per process
  absl::Duration connect_timeout = absl::Seconds(30);
  absl::Duration update_timeout = absl::Minutes(5);
  absl::Duration group_timeout = absl::Minutes(2);
  // This rank's address in the groups that span workers (ddp's global group,
  // the leaders' start barrier): loopback when every worker runs on this
  // host, else the address of this worker's own interface.
  std::string group_address = "127.0.0.1";
  // Hash the parameters after every round so that the report can show every
  // rank agrees; one pass over the model per round (off for benchmarks).
  bool hash_params = true;
  // At the end, each worker checks its final anchor against the shards'
  // (Co2OptimizerOptions::verify_final_anchor; one download of the model).
  bool verify_final_anchor = true;
  absl::Duration round_timeout = absl::Seconds(60);  // embedded shards
  // JobConfig.deterministic: exact, order-independent sums on the shards.
  bool deterministic = false;
  // JobConfig.outlier_ratio: k of the shards' outlier rule (0: off).
  float outlier_ratio = common::kDefaultOutlierRatio;
  // Eager updates (Co2OptimizerOptions::eager_share = 1/workers); co2 only:
  // the synchronous algorithms have no stale average to make up for.
  bool eager = false;
  // Carried progress (Co2OptimizerOptions::carry_progress); co2 only, not
  // with eager updates (main.cc: --carry_progress where DefaultCarryProgress
  // allows it).
  bool carry_progress = false;
  // co2: when a worker applies the update a round owes, "boundary" or
  // "arrival" (Co2OptimizerOptions::apply; main.cc's default is
  // DefaultApplyAt).
  std::string apply = "boundary";
  // With "arrival": the inner step by which the owed update is applied at the
  // latest (Co2OptimizerOptions::apply_by_step); 0: the boundary.
  int apply_by_step = 0;
  // This worker restarts into a running job (after a crash): it skips the
  // start barrier, fetches the anchor and trains from the shards' round.
  bool rejoin = false;
  // This worker joins a running job as a new member (the job grows): it
  // skips the start barrier, fetches the anchor and trains from the shards'
  // round. A worker leaves the job cleanly on SIGTERM: at its next boundary,
  // once its last Δ is counted (Co2Optimizer::RequestLeave).
  bool join = false;
  // Launcher: how many of the `workers` take part from which round on,
  // "ROUND:COUNT,..." with rising rounds (ParseScale); from round 0 all of
  // them unless the first entry is round 0. The launcher starts workers
  // into the running job (join) and stops the highest-numbered ones with
  // SIGTERM when worker 0 has finished the round before. "" = fixed.
  std::string scale;
  // Worker checkpoints (apps/co2-train/worker_checkpoint.h) at every round
  // boundary into this directory, which the embedded shards also keep their
  // checkpoints and the job's name in; "" = none. Every round, so that the
  // shards, which replay the last two rounds' updates, are never further
  // than a resume can follow.
  std::string checkpoint_dir;
  // Continue the job of checkpoint_dir after every process of it stopped:
  // each worker joins at the round of its checkpoint with its saved state.
  bool resume = false;
  // A worker leader the shards cannot take back where it is (behind what
  // they can replay, a stale contribution, dropped after its lease) fetches
  // their anchor and continues at their round in the same process.
  bool heal = true;
  // How many times the launcher restarted this worker's node: its local
  // ranks meet in a rendezvous of that generation, apart from the stale
  // keys of the ranks that died.
  int restart = 0;
  // Launcher: when a process of a worker dies, every local rank of that
  // worker (its node) is restarted (with `rejoin`), up to this many times
  // per worker before the run fails. Needs an aggregator algorithm.
  int max_restarts = 0;
  std::string report;                  // final JSON report path ("" = none)
  std::string run_dir;                 // scratch directory shared by ranks
  bool progress = true;                // launcher: live one-line display
  bool keep_run_dir = false;           // launcher: keep logs for debugging
  // Worker leaders serve Prometheus metrics (client/worker_metrics.h) on
  // port metrics_port; 0 picks a free port, -1 serves none. The launcher
  // gives worker w the port metrics_port + w, so that the workers it starts
  // on one host do not collide; a worker started by itself (a container, a
  // pod) serves on metrics_port as given.
  int metrics_port = -1;
  // The path between a worker leader and the shards, as configured: its
  // TCP settings are checked against it at start and exported with the
  // metrics (common/host_tcp.h). Zero: not said.
  common::LinkPath link_path;
  std::string metrics_host = "0.0.0.0";  // the address /metrics listens on
  // Testing seam of the fault suite (tests/fault_training_test.sh):
  // "WORKER:WHAT" makes that worker's first process (not a --rejoin) fail
  // at one exact point. WHAT is kill_in_round=R (SIGKILL after the inner
  // steps of round R, before its boundary), kill_before_finish (its last Δ
  // pushed, the last update not applied), kill_after_finish (final anchor
  // applied and verified, no report written) or flip_final_bit (one bit of
  // its final model flipped after the check, before the report) or
  // scale_delta=A-B (the Δ it pushes in rounds A to B multiplied by
  // kInjectedDeltaScale, as a diverged worker's; "A-" for every round from
  // A on). "" = none.
  std::string inject_fault;
};

// One step of TrainerOptions::scale: from `round` on, workers 0 .. count − 1
// take part.
struct ScaleStep {
  uint64_t round = 0;
  int count = 0;
};
// INVALID_ARGUMENT naming the entry: not ROUND:COUNT, a count outside
// [1, workers], rounds that do not rise.
absl::StatusOr<std::vector<ScaleStep>> ParseScale(absl::string_view spec,
                                                  int workers);
// The workers that start the job (TrainerOptions::scale's count at round 0,
// else all of them); options must be valid.
int InitialWorkers(const TrainerOptions& options);

// Checks ranges and names (INVALID_ARGUMENT naming the flag and value).
absl::Status ValidateTrainerOptions(const TrainerOptions& options);

// Whether the workers run eager updates: asked for, and the algorithm is co2
// (the synchronous ones have no stale average to make up for).
bool RunsEagerUpdates(const TrainerOptions& options);

// The inner learning rate of `algo` on `task` where the user gives none:
// the best of the convergence study's sweeps (docs/results/convergence.md).
// co2's default outer step is Local-SGD's plain average, and so is its lr;
// diloco's is smaller: its Nesterov outer step amplifies the round's Δ.
double DefaultLearningRate(absl::string_view task, absl::string_view algo);

// The job's settings (JobConfig) that `options` give the shards for `algo`;
// num_parameters, num_shards and rounds are left for the caller.
// INVALID_ARGUMENT naming an unknown momentum, penalty, clip or codec.
absl::StatusOr<v1::JobConfig> MakeJobConfig(const TrainerOptions& options,
                                            Algo algo);

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_TRAINER_OPTIONS_H_
