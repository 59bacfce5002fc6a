// Why a durable write failed, by the class of its errno: the `reason` label
// of co2_aggregator_checkpoint_failures_total (docs/operations.md) and the
// text a shard tells its waiting workers. ErrnoStatus (durable_file.h)
// attaches the errno to its status as a payload (WithErrno); this unit is the
// one place that reads it back.
//
// Stateless functions; any thread.
#ifndef CO2_SERVER_STORAGE_WRITE_FAILURE_H_
#define CO2_SERVER_STORAGE_WRITE_FAILURE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace co2::server {

enum class WriteFailure {
  kNoSpace,     // ENOSPC, EDQUOT: the disk or the quota is full
  kIoError,     // EIO: the device failed
  kPermission,  // EACCES, EPERM, EROFS: not writable by the shard
  kOther,       // any other errno, or an error that carries none; the last:
                // ShardMetrics registers every reason up to it
};

// `status` with `err` attached (the errno a system call failed with).
absl::Status WithErrno(absl::Status status, int err);
// The errno attached by WithErrno; nullopt if none is.
std::optional<int> ErrnoOf(const absl::Status& status);

// The class of the errno attached to `status` (not OK); kOther without one.
WriteFailure WriteFailureOf(const absl::Status& status);
// "no_space", "io_error", "permission", "other".
absl::string_view WriteFailureName(WriteFailure failure);
// What failed, for people: the errno's text ("No space left on device"), or
// the status's message when it carries no errno.
std::string WriteFailureText(const absl::Status& status);

}  // namespace co2::server

#endif  // CO2_SERVER_STORAGE_WRITE_FAILURE_H_
