#include "server/job/shard_observer.h"

#include "absl/strings/match.h"

namespace co2::server {

RejectReason RejectReasonOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      // common::Validate names a NaN/Inf element "... is not finite: nan",
      // and the round's sums a term they cannot take "... is not finite";
      // codec_test, exact_sum_test and shard_metrics_test pin that wording.
      return absl::StrContains(status.message(), "is not finite")
                 ? RejectReason::kNonFinite
                 : RejectReason::kInvalidArgument;
    case absl::StatusCode::kAborted:
      return RejectReason::kStale;
    case absl::StatusCode::kFailedPrecondition:
      // JobShard refuses an evicted worker's chunks saying it "was evicted";
      // shard_metrics_test pins that wording.
      return absl::StrContains(status.message(), "was evicted")
                 ? RejectReason::kEvicted
                 : RejectReason::kAhead;
    case absl::StatusCode::kNotFound:
      return RejectReason::kNotMember;
    case absl::StatusCode::kResourceExhausted:
      return RejectReason::kResourceExhausted;
    default:
      return RejectReason::kOther;
  }
}

absl::string_view RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kInvalidArgument:
      return "invalid_argument";
    case RejectReason::kNonFinite:
      return "non_finite";
    case RejectReason::kStale:
      return "stale";
    case RejectReason::kAhead:
      return "ahead";
    case RejectReason::kNotMember:
      return "not_member";
    case RejectReason::kEvicted:
      return "evicted";
    case RejectReason::kResourceExhausted:
      return "resource_exhausted";
    case RejectReason::kOutlier:
      return "outlier";
    case RejectReason::kOther:
      break;
  }
  return "other";
}

absl::string_view ReseedReasonName(ReseedReason reason) {
  switch (reason) {
    case ReseedReason::kMissing:
      return "missing";
    case ReseedReason::kCorrupt:
      return "corrupt";
  }
  return "missing";
}

}  // namespace co2::server
