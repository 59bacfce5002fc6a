// JobRegistry: the jobs one aggregator shard serves, and the poller thread
// that drives them: it closes rounds (running the outer step off the gRPC
// reactor threads), expires leases, wakes at the earliest deadline, and does
// what touches the disk for the job list: restoring a job from its
// checkpoint, retiring jobs and deleting them. A job that is not OPEN
// (server/job/job_lifecycle.h) leaves memory after `retention`; the registry
// remembers it by name, so that a FINISHED job's name stays taken and an
// ABANDONED job resumes from its checkpoint when a worker joins it.
// Thread-safe; a JobShard it returns stays valid while the caller holds it.
#ifndef CO2_SERVER_JOB_JOB_REGISTRY_H_
#define CO2_SERVER_JOB_JOB_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "co2/v1/aggregator.pb.h"
#include "common/clock.h"
#include "server/job/job_shard.h"
#include "server/storage/checkpoint_store.h"

namespace co2::server {

struct JobRegistryOptions {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  uint32_t max_jobs = 64;  // RESOURCE_EXHAUSTED past this (jobs in memory)
  // Largest JobConfig.num_parameters a job may declare (RESOURCE_EXHAUSTED):
  // a shard allocates ~5 fp32 copies of its range when the job is created.
  uint64_t max_parameters = uint64_t{1} << 32;
  JobShardOptions shard;  // shard_index is copied from above
  // Used for a JobConfig that leaves min_workers / round_timeout_ms at 0.
  uint32_t default_min_workers = 1;
  absl::Duration default_round_timeout = absl::Seconds(60);
  // Directory of the shard checkpoints; empty: no checkpoints. OPEN jobs
  // found there are restored at start; the others are remembered by name.
  std::string checkpoint_dir;
  // The poller re-checks deadlines at least this often; it is woken at once
  // by new contributions.
  absl::Duration max_poll_interval = absl::Milliseconds(500);
  // How long a FINISHED or ABANDONED job stays in memory.
  absl::Duration retention = absl::Hours(1);
};

class JobRegistry {
 public:
  // `clock` is borrowed. Restores the jobs checkpointed in
  // options.checkpoint_dir (logging the files it cannot use and setting them
  // aside), then starts the poller thread.
  JobRegistry(const JobRegistryOptions& options, common::Clock* clock);
  ~JobRegistry();  // stops the poller
  JobRegistry(const JobRegistry&) = delete;
  JobRegistry& operator=(const JobRegistry&) = delete;

  // `config` with the server's defaults filled in for fields left at 0.
  v1::JobConfig WithDefaults(v1::JobConfig config) const;

  // The job, created with `config` (after WithDefaults) on its first call.
  // INVALID_ARGUMENT for a config that is invalid or names another number of
  // shards. A job that left memory: FAILED_PRECONDITION when it is FINISHED
  // and this is not a `rejoin`; otherwise UNAVAILABLE while the poller
  // restores it from its checkpoint (retry), or a new job when it has none.
  absl::StatusOr<std::shared_ptr<JobShard>> GetOrCreate(
      const std::string& job, const v1::JobConfig& config, bool rejoin = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  // NOT_FOUND naming the job if nobody joined it.
  absl::StatusOr<std::shared_ptr<JobShard>> Find(const std::string& job) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Asks the poller to poll every job now (after a contribution).
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);

  // Every job: those in memory and those remembered by name, sorted.
  std::vector<v1::JobSummary> List() const ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes `job` on the poller thread and then calls `done` there with the
  // files it removed: NOT_FOUND for an unknown job, FAILED_PRECONDITION for
  // an OPEN one with live workers (JobShard::RetireForDelete).
  void Delete(const std::string& job,
              std::function<void(absl::StatusOr<std::vector<std::string>>)> done)
      ABSL_LOCKS_EXCLUDED(mu_);

  const JobRegistryOptions& options() const { return options_; }
  // Checkpoint files found unusable at start (DATA_LOSS each); each was
  // renamed to <file>.corrupt-<unix ms> (CheckpointStore::SetAside).
  const std::vector<absl::Status>& restore_errors() const {
    return restore_errors_;
  }

 private:
  // A job that is not in memory: past its retention, or not OPEN in the
  // checkpoint found at start.
  struct RetiredJob {
    v1::JobSummary summary;  // in_memory false; seconds_in_state from `since`
    absl::Time since;        // entered its state (or was found at start)
    bool has_checkpoint = false;
    bool restore_requested = false;  // a Join waits for the poller to load it
  };
  struct Deletion {
    std::string job;
    std::function<void(absl::StatusOr<std::vector<std::string>>)> done;
  };

  void PollLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void RestoreJobs() ABSL_LOCKS_EXCLUDED(mu_);
  JobShardOptions ShardOptions(const std::string& job) const;
  // The poller's work on the job list: restores requested by Joins, retired
  // jobs, deletions.
  void MaintainJobs() ABSL_LOCKS_EXCLUDED(mu_);
  void RestoreRetired(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<std::string>> DeleteNow(const std::string& job)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the job's checkpoint and journal; returns the files removed.
  std::vector<std::string> RemoveFiles(const std::string& job) const;

  const JobRegistryOptions options_;
  common::Clock* const clock_;
  std::unique_ptr<CheckpointStore> checkpoints_;  // null without a directory
  std::vector<absl::Status> restore_errors_;
  // Checkpoint files found unusable at start (and set aside): a job whose
  // file is here is re-seeded for reason "corrupt". Written only by the
  // constructor.
  absl::flat_hash_set<std::string> corrupt_paths_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<JobShard>> jobs_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, RetiredJob> retired_ ABSL_GUARDED_BY(mu_);
  std::vector<Deletion> deletions_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread poller_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_JOB_REGISTRY_H_
