// JobTokens: the bearer tokens a shard accepts, per job, for any job and for
// the admin service, as read from --job_tokens_file and --admin_token_file.
// The file format: one `job token` pair per line, `*` as the job for a token
// valid for every job without its own line, blank lines and lines starting
// with # ignored. The file should be readable by the shard's user only
// (chmod 600); a group- or world-readable one is warned about.
// Values and pure functions; any thread.
#ifndef CO2_SERVER_SERVICE_JOB_TOKENS_H_
#define CO2_SERVER_SERVICE_JOB_TOKENS_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace co2::server {

struct JobTokens {
  absl::flat_hash_map<std::string, std::string> per_job;  // job → token
  std::string any_job;  // accepted for jobs without their own; empty = none
  // For the admin service only (--admin_token_file); empty: admin calls are
  // refused. Needs job tokens: a shard without them checks no token at all.
  std::string admin;

  // No job token: the shard checks no tokens.
  bool empty() const { return per_job.empty() && any_job.empty(); }
};

// Parses a tokens file: one `job token` pair per line, `*` as the job for a
// token valid for every job without its own line; blank lines and lines
// starting with # are ignored. INVALID_ARGUMENT naming `source` and the line
// for anything else (a third field, a duplicate job, an empty token).
absl::StatusOr<JobTokens> ParseJobTokens(absl::string_view text,
                                         const std::string& source);
// Reads and parses the file at `path` (errors name the path).
absl::StatusOr<JobTokens> LoadJobTokensFile(const std::string& path);

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_JOB_TOKENS_H_
