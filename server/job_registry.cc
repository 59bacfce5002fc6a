#include "server/job_registry.h"

#include <algorithm>
#include <vector>

#include "common/logging.h"
#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/status_macros.h"

namespace co2::server {

JobRegistry::JobRegistry(const JobRegistryOptions& options,
                         common::Clock* clock)
    : options_(options), clock_(clock) {
  if (!options_.checkpoint_dir.empty()) {
    checkpoints_ = std::make_unique<CheckpointStore>(options_.checkpoint_dir);
    RestoreJobs();
  }
  poller_ = std::thread([this] { PollLoop(); });
}

void JobRegistry::RestoreJobs() {
  std::vector<UnusableCheckpoint> unusable;
  std::vector<LoadedCheckpoint> loaded = checkpoints_->LoadAll(
      options_.shard_index, options_.num_shards, &unusable);
  absl::MutexLock lock(&mu_);
  for (LoadedCheckpoint& checkpoint : loaded) {
    const std::string job = checkpoint.header.job();
    const uint64_t round = checkpoint.header.rounds_closed();
    auto restored = JobShard::Restore(std::move(checkpoint), ShardOptions(job),
                                      clock_);
    if (!restored.ok()) {
      unusable.push_back(UnusableCheckpoint{
          checkpoints_->PathFor(job, options_.shard_index, options_.num_shards),
          restored.status()});
      continue;
    }
    CO2_LOG(INFO) << "shard " << options_.shard_index << ": restored job "
                  << job << " at round " << round << " from "
                  << checkpoints_->dir();
    jobs_.emplace(job, *std::move(restored));
  }
  for (const UnusableCheckpoint& bad : unusable) {
    // The job starts without state when a worker joins it; the first worker
    // that resumes it re-seeds it (JobShard::Join). The file is kept aside
    // so that the job's next checkpoint does not overwrite the evidence.
    restore_errors_.push_back(bad.error);
    corrupt_paths_.insert(bad.path);
    absl::StatusOr<std::string> aside = CheckpointStore::SetAside(bad.path);
    CO2_LOG(ERROR) << "shard " << options_.shard_index << ": cannot restore "
                   << bad.path << ": " << bad.error << "; "
                   << (aside.ok() ? absl::StrCat("set aside as ", *aside)
                                  : absl::StrCat("cannot set it aside: ",
                                                 aside.status().ToString()));
  }
}

JobShardOptions JobRegistry::ShardOptions(const std::string& job) const {
  JobShardOptions shard = options_.shard;
  shard.shard_index = options_.shard_index;
  shard.checkpoints = checkpoints_.get();
  if (checkpoints_ != nullptr &&
      corrupt_paths_.contains(checkpoints_->PathFor(
          job, options_.shard_index, options_.num_shards))) {
    shard.reseed_reason = ReseedReason::kCorrupt;
  }
  return shard;
}

JobRegistry::~JobRegistry() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  poller_.join();
}

v1::JobConfig JobRegistry::WithDefaults(v1::JobConfig config) const {
  if (config.min_workers() == 0) {
    config.set_min_workers(options_.default_min_workers);
  }
  if (config.round_timeout_ms() == 0) {
    config.set_round_timeout_ms(static_cast<uint32_t>(
        absl::ToInt64Milliseconds(options_.default_round_timeout)));
  }
  return config;
}

absl::StatusOr<JobShard*> JobRegistry::GetOrCreate(
    const std::string& job, const v1::JobConfig& requested) {
  const v1::JobConfig config = WithDefaults(requested);
  CO2_RETURN_IF_ERROR(common::ValidateJobConfig(config));
  if (config.num_shards() != options_.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "JobConfig.num_shards is ", config.num_shards(), " but this shard (",
        options_.shard_index, ") belongs to a service of ", options_.num_shards,
        " shards"));
  }
  if (config.num_parameters() > options_.max_parameters) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "JobConfig.num_parameters is ", config.num_parameters(),
        ", more than this shard accepts (limit ", options_.max_parameters,
        ", --max_parameters)"));
  }
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it != jobs_.end()) return it->second.get();
  if (jobs_.size() >= options_.max_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot create job \"", job, "\": ", jobs_.size(),
        " jobs already (limit ", options_.max_jobs, ")"));
  }
  CO2_ASSIGN_OR_RETURN(
      auto created,
      JobShard::Create(std::string(job), config, ShardOptions(job), clock_));
  CO2_LOG(INFO) << "shard " << options_.shard_index << ": new job " << job << " ["
            << created->range().begin << ", " << created->range().end
            << "): " << common::DescribeJobConfig(config);
  JobShard* raw = created.get();
  jobs_.emplace(std::string(job), std::move(created));
  return raw;
}

absl::StatusOr<JobShard*> JobRegistry::Find(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown job \"", job, "\" (join it first)"));
  }
  return it->second.get();
}

void JobRegistry::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

void JobRegistry::PollLoop() {
  absl::Time next = clock_->Now();
  while (true) {
    std::vector<JobShard*> jobs;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return wake_ || stop_;
      };
      // The clock may be a FakeClock in tests, so the real wait is bounded
      // by max_poll_interval as well as by the next deadline.
      const absl::Duration wait = std::clamp(
          next - clock_->Now(), absl::ZeroDuration(), options_.max_poll_interval);
      mu_.AwaitWithTimeout(absl::Condition(&woken), wait);
      if (stop_) return;
      wake_ = false;
      for (auto& [name, job] : jobs_) jobs.push_back(job.get());
    }
    next = absl::InfiniteFuture();
    for (JobShard* job : jobs) {
      job->Poll();
      next = std::min(next, job->NextDeadline());
    }
  }
}

}  // namespace co2::server
