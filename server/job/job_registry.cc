#include "server/job/job_registry.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/job/job_lifecycle.h"

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
    const v1::JobState state = checkpoint.header.state();
    if (state == v1::JOB_STATE_FINISHED || state == v1::JOB_STATE_ABANDONED) {
      RetiredJob& retired = retired_[job];
      retired.summary.set_job(job);
      retired.summary.set_state(state);
      retired.summary.set_open_round(round);
      retired.summary.set_rounds(checkpoint.header.config().rounds());
      retired.since = clock_->Now();
      retired.has_checkpoint = true;
      CO2_LOG(INFO) << "shard " << options_.shard_index << ": job " << job
                    << " is " << JobStateName(state) << " at round " << round
                    << " (kept on disk, not in memory)";
      continue;
    }
    auto restored =
        JobShard::Restore(std::move(checkpoint), ShardOptions(job), clock_);
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
  std::vector<Deletion> deletions;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  poller_.join();
  {
    absl::MutexLock lock(&mu_);
    deletions.swap(deletions_);
  }
  for (Deletion& d : deletions) {
    d.done(absl::UnavailableError("shard shutting down before the deletion"));
  }
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

absl::StatusOr<std::shared_ptr<JobShard>> JobRegistry::GetOrCreate(
    const std::string& job, const v1::JobConfig& requested, bool rejoin) {
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
  if (it != jobs_.end()) return it->second;
  auto retired = retired_.find(job);
  if (retired != retired_.end()) {
    RetiredJob& r = retired->second;
    const bool finished = r.summary.state() == v1::JOB_STATE_FINISHED;
    if (finished && !rejoin) return FinishedJobError(job, r.summary.rounds());
    if (r.has_checkpoint) {
      // Reading the checkpoint is the poller's work, not a reaction's.
      r.restore_requested = true;
      wake_ = true;
      return absl::UnavailableError(
          absl::StrCat("job \"", job, "\" is being restored from its "
                       "checkpoint on shard ", options_.shard_index, "; retry"));
    }
    if (finished) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job \"", job, "\" finished and left the memory of shard ",
          options_.shard_index,
          ", which keeps no checkpoints: its final anchor is gone there"));
    }
    retired_.erase(retired);
  }
  if (jobs_.size() >= options_.max_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot create job \"", job, "\": ", jobs_.size(),
        " jobs already (limit ", options_.max_jobs, ")"));
  }
  CO2_ASSIGN_OR_RETURN(
      std::unique_ptr<JobShard> created,
      JobShard::Create(std::string(job), config, ShardOptions(job), clock_));
  CO2_LOG(INFO) << "shard " << options_.shard_index << ": new job " << job
                << " [" << created->range().begin << ", "
                << created->range().end
                << "): " << common::DescribeJobConfig(config);
  std::shared_ptr<JobShard> shard = std::move(created);
  jobs_.emplace(job, shard);
  return shard;
}

absl::StatusOr<std::shared_ptr<JobShard>> JobRegistry::Find(
    const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown job \"", job, "\" (join it first)"));
  }
  return it->second;
}

void JobRegistry::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

std::vector<v1::JobSummary> JobRegistry::List() const {
  std::vector<v1::JobSummary> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, shard] : jobs_) jobs.push_back(shard->Summary());
    for (const auto& [name, retired] : retired_) {
      v1::JobSummary summary = retired.summary;
      summary.set_seconds_in_state(
          absl::ToDoubleSeconds(clock_->Now() - retired.since));
      jobs.push_back(std::move(summary));
    }
  }
  std::sort(jobs.begin(), jobs.end(),
            [](const v1::JobSummary& a, const v1::JobSummary& b) {
              return a.job() < b.job();
            });
  return jobs;
}

void JobRegistry::Delete(
    const std::string& job,
    std::function<void(absl::StatusOr<std::vector<std::string>>)> done) {
  absl::MutexLock lock(&mu_);
  deletions_.push_back(Deletion{job, std::move(done)});
  wake_ = true;
}

void JobRegistry::PollLoop() {
  absl::Time next = clock_->Now();
  while (true) {
    std::vector<std::shared_ptr<JobShard>> jobs;
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
      for (auto& [name, job] : jobs_) jobs.push_back(job);
    }
    next = absl::InfiniteFuture();
    for (const std::shared_ptr<JobShard>& job : jobs) {
      job->Poll();
      next = std::min(next, job->NextDeadline());
    }
    MaintainJobs();
  }
}

void JobRegistry::MaintainJobs() {
  std::vector<std::string> restores;
  std::vector<Deletion> deletions;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, retired] : retired_) {
      if (retired.restore_requested) restores.push_back(name);
    }
    deletions.swap(deletions_);
    std::vector<std::string> expired;
    for (const auto& [name, shard] : jobs_) {
      if (shard->RetireIfExpired(options_.retention)) expired.push_back(name);
    }
    for (const std::string& name : expired) {
      RetiredJob retired;
      retired.summary = jobs_[name]->Summary();
      retired.summary.set_in_memory(false);
      retired.since = clock_->Now() - absl::Seconds(
                                          retired.summary.seconds_in_state());
      retired.has_checkpoint = checkpoints_ != nullptr;
      jobs_.erase(name);
      CO2_LOG(INFO) << "shard " << options_.shard_index << ": job " << name
                    << " (" << JobStateName(retired.summary.state())
                    << ") left memory after its retention"
                    << (retired.has_checkpoint ? "; its checkpoint stays"
                                               : "");
      retired_[name] = std::move(retired);
    }
  }
  for (const std::string& job : restores) RestoreRetired(job);
  for (Deletion& d : deletions) d.done(DeleteNow(d.job));
}

void JobRegistry::RestoreRetired(const std::string& job) {
  const std::string path =
      checkpoints_->PathFor(job, options_.shard_index, options_.num_shards);
  absl::StatusOr<std::unique_ptr<JobShard>> restored =
      [&]() -> absl::StatusOr<std::unique_ptr<JobShard>> {
    CO2_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, CheckpointStore::Load(path));
    return JobShard::Restore(std::move(loaded), ShardOptions(job), clock_);
  }();
  absl::MutexLock lock(&mu_);
  retired_.erase(job);
  if (!restored.ok()) {
    // The next Join starts the job afresh; a resuming worker re-seeds it.
    absl::StatusOr<std::string> aside = CheckpointStore::SetAside(path);
    CO2_LOG(ERROR) << "shard " << options_.shard_index << ": cannot restore "
                   << path << ": " << restored.status() << "; "
                   << (aside.ok() ? absl::StrCat("set aside as ", *aside)
                                  : aside.status().ToString());
    return;
  }
  CO2_LOG(INFO) << "shard " << options_.shard_index << ": restored job " << job
                << " from " << path << " for a worker that joins it";
  jobs_.emplace(job, *std::move(restored));
}

absl::StatusOr<std::vector<std::string>> JobRegistry::DeleteNow(
    const std::string& job) {
  std::shared_ptr<JobShard> shard;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it != jobs_.end()) {
      shard = it->second;
    } else if (retired_.erase(job) == 0) {
      return absl::NotFoundError(
          absl::StrCat("no job \"", job, "\" on shard ", options_.shard_index));
    }
  }
  if (shard != nullptr) {
    CO2_RETURN_IF_ERROR(shard->RetireForDelete());
    absl::MutexLock lock(&mu_);
    jobs_.erase(job);
  }
  std::vector<std::string> removed = RemoveFiles(job);
  CO2_LOG(INFO) << "shard " << options_.shard_index << ": deleted job " << job
                << (removed.empty() ? std::string()
                                    : absl::StrCat(" and ",
                                                   absl::StrJoin(removed, ", ")));
  return removed;
}

std::vector<std::string> JobRegistry::RemoveFiles(const std::string& job) const {
  std::vector<std::string> removed;
  if (checkpoints_ == nullptr) return removed;
  for (const std::string& path :
       {checkpoints_->PathFor(job, options_.shard_index, options_.num_shards),
        checkpoints_->JournalPathFor(job, options_.shard_index,
                                     options_.num_shards)}) {
    if (std::remove(path.c_str()) == 0) {
      removed.push_back(path);
    } else if (errno != ENOENT) {
      CO2_LOG(WARNING) << "cannot remove " << path << ": "
                       << std::strerror(errno);
    }
  }
  return removed;
}

}  // namespace co2::server
