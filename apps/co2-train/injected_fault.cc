#include "apps/co2-train/injected_fault.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"

namespace co2::client {
namespace {

absl::Status BadFault(const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--inject_fault ", why));
}

}  // namespace

absl::StatusOr<InjectedFault> ParseInjectedFault(absl::string_view spec) {
  InjectedFault f;
  if (spec.empty()) return f;
  const std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(spec, absl::MaxSplits(':', 1));
  if (!absl::SimpleAtoi(parts.first, &f.worker) || f.worker < 0) {
    return BadFault(
        absl::StrCat("must be WORKER:WHAT, got '", spec, "' (bad worker)"));
  }
  absl::string_view what = parts.second;
  if (absl::ConsumePrefix(&what, "kill_in_round=")) {
    f.kind = InjectedFault::Kind::kKillInRound;
    if (!absl::SimpleAtoi(what, &f.round) || f.round < 0) {
      return BadFault(
          absl::StrCat("kill_in_round needs a round >= 0, got '", spec, "'"));
    }
  } else if (what == "kill_before_finish") {
    f.kind = InjectedFault::Kind::kKillBeforeFinish;
  } else if (what == "kill_after_finish") {
    f.kind = InjectedFault::Kind::kKillAfterFinish;
  } else if (what == "flip_final_bit") {
    f.kind = InjectedFault::Kind::kFlipFinalBit;
  } else if (absl::ConsumePrefix(&what, "scale_delta=")) {
    f.kind = InjectedFault::Kind::kScaleDelta;
    const std::pair<absl::string_view, absl::string_view> rounds =
        absl::StrSplit(what, absl::MaxSplits('-', 1));
    f.last_round = UINT64_MAX;
    if (!absl::SimpleAtoi(rounds.first, &f.round) || f.round < 0 ||
        (!rounds.second.empty() &&
         (!absl::SimpleAtoi(rounds.second, &f.last_round) ||
          f.last_round < static_cast<uint64_t>(f.round))) ||
        what.find('-') == absl::string_view::npos) {
      return BadFault(
          absl::StrCat("scale_delta needs rounds A-B (B >= A >= 0) or "
                       "A-, got '",
                       spec, "'"));
    }
  } else {
    return BadFault(absl::StrCat("unknown fault in '", spec,
                                 "' (kill_in_round=R, kill_before_finish, "
                                 "kill_after_finish, flip_final_bit, "
                                 "scale_delta=A-B)"));
  }
  return f;
}

void KillSelf(const std::string& where) {
  CO2_LOG(WARNING) << "inject_fault: SIGKILL " << where;
  std::fflush(nullptr);
  raise(SIGKILL);
  std::abort();
}

}  // namespace co2::client
