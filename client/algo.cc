#include "client/algo.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace co2::client {

absl::StatusOr<Algo> ParseAlgo(absl::string_view name) {
  if (name == "co2") return Algo::kCo2;
  if (name == "ddp") return Algo::kDdp;
  if (name == "localsgd") return Algo::kLocalSgd;
  if (name == "slowmo") return Algo::kSlowMo;
  if (name == "diloco") return Algo::kDiLoCo;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown algorithm '", name,
                   "' (expected co2, ddp, localsgd, slowmo, diloco)"));
}

absl::StatusOr<ApplyAt> ParseApplyAt(absl::string_view name) {
  if (name == "boundary") return ApplyAt::kBoundary;
  if (name == "arrival") return ApplyAt::kArrival;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown apply mode '", name, "' (expected boundary, arrival)"));
}

absl::string_view ApplyAtName(ApplyAt apply) {
  return apply == ApplyAt::kArrival ? "arrival" : "boundary";
}

absl::Status CheckApplyAt(Algo algo, ApplyAt apply, bool deterministic) {
  if (apply != ApplyAt::kArrival) return absl::OkStatus();
  if (algo != Algo::kCo2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arrival is for co2, whose update arrives while the next round "
        "computes; ",
        AlgoName(algo), " waits for its update at the boundary"));
  }
  if (deterministic) {
    return absl::InvalidArgumentError(
        "arrival is not for a deterministic job: the step an update is "
        "applied at depends on when it arrives, so two runs would differ; "
        "use boundary");
  }
  return absl::OkStatus();
}

ApplyAt DefaultApplyAt(Algo algo, bool deterministic) {
  return algo == Algo::kCo2 && !deterministic ? ApplyAt::kArrival
                                              : ApplyAt::kBoundary;
}

absl::Status CheckApplyBy(ApplyAt apply, int apply_by_step, int tau) {
  if (apply_by_step == 0) return absl::OkStatus();
  if (apply != ApplyAt::kArrival) {
    return absl::InvalidArgumentError(absl::StrCat(
        "is ", apply_by_step,
        ", which bounds when an update applied on arrival is applied; with "
        "apply=",
        ApplyAtName(apply), " it is applied at the boundary"));
  }
  if (apply_by_step < 0 || apply_by_step >= tau) {
    return absl::InvalidArgumentError(absl::StrCat(
        "is ", apply_by_step, ": must be between 1 and tau - 1 = ",
        tau - 1, " (0: wait for the update only at the boundary)"));
  }
  return absl::OkStatus();
}

bool DefaultCarryProgress(Algo algo, bool eager) {
  return algo == Algo::kCo2 && !eager;
}

absl::string_view AlgoName(Algo algo) {
  switch (algo) {
    case Algo::kCo2:
      return "co2";
    case Algo::kDdp:
      return "ddp";
    case Algo::kLocalSgd:
      return "localsgd";
    case Algo::kSlowMo:
      return "slowmo";
    case Algo::kDiLoCo:
      return "diloco";
  }
  return "?";
}

uint32_t StalenessOf(Algo algo) { return algo == Algo::kCo2 ? 1 : 0; }

void ApplyAlgo(Algo algo, v1::JobConfig& config) {
  config.set_max_staleness(StalenessOf(algo));
  if (algo == Algo::kLocalSgd) {  // a plain blocking average
    config.set_alpha(1.0f);
    config.set_beta(0.0f);
  }
  if (algo == Algo::kDiLoCo) config.set_momentum(v1::MOMENTUM_NESTEROV);
  if (algo == Algo::kLocalSgd || algo == Algo::kSlowMo ||
      algo == Algo::kDiLoCo) {
    config.set_gap_penalty(v1::GAP_PENALTY_NONE);
    config.set_clip(v1::CLIP_NONE);
  }
}

OuterDefaults OuterDefaultsOf(Algo algo) {
  if (algo == Algo::kDiLoCo) return {0.7f, 0.9f};
  return {1.0f, 0.0f};
}

}  // namespace co2::client
