#include "server/storage/write_failure.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace co2::server {
namespace {

// The payload's type URL: the decimal errno.
constexpr absl::string_view kErrnoUrl = "co2.server/errno";

}  // namespace

absl::Status WithErrno(absl::Status status, int err) {
  status.SetPayload(kErrnoUrl, absl::Cord(absl::StrCat(err)));
  return status;
}

std::optional<int> ErrnoOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kErrnoUrl);
  int err = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &err)) {
    return std::nullopt;
  }
  return err;
}

WriteFailure WriteFailureOf(const absl::Status& status) {
  switch (ErrnoOf(status).value_or(0)) {
    case ENOSPC:
    case EDQUOT:
      return WriteFailure::kNoSpace;
    case EIO:
      return WriteFailure::kIoError;
    case EACCES:
    case EPERM:
    case EROFS:
      return WriteFailure::kPermission;
    default:
      return WriteFailure::kOther;
  }
}

absl::string_view WriteFailureName(WriteFailure failure) {
  switch (failure) {
    case WriteFailure::kNoSpace:
      return "no_space";
    case WriteFailure::kIoError:
      return "io_error";
    case WriteFailure::kPermission:
      return "permission";
    case WriteFailure::kOther:
      break;
  }
  return "other";
}

std::string WriteFailureText(const absl::Status& status) {
  const std::optional<int> err = ErrnoOf(status);
  return err ? std::string(std::strerror(*err)) : std::string(status.message());
}

}  // namespace co2::server
