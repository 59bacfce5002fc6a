#include "common/job_config.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/layout.h"
#include "google/protobuf/util/message_differencer.h"

namespace co2::common {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view rule,
                     double value) {
  return absl::InvalidArgumentError(
      absl::StrCat("JobConfig.", field, " ", rule, ", got ", value));
}

bool IsKnownCodec(int codec) { return codec >= 1 && codec <= 3; }

}  // namespace

v1::JobConfig DefaultJobConfig(uint64_t num_parameters, uint32_t num_shards) {
  v1::JobConfig c;
  c.set_protocol_version(kProtocolVersion);
  c.set_num_parameters(num_parameters);
  c.set_num_shards(num_shards);
  // docs/outer-settings.md and docs/results/convergence.md: co2's default
  // outer step is the plain average, as Local-SGD's, with each worker
  // carrying its own progress across the round its update is owed (client::
  // DefaultCarryProgress). Without carried progress a one-round-stale anchor
  // is stable only while β + α·c < 1: such a job sets a smaller α. The
  // penalty and clipping cost accuracy and are opt-in.
  c.set_alpha(1.0f);
  c.set_beta(0.0f);
  c.set_momentum(v1::MOMENTUM_HEAVY_BALL);
  c.set_gap_penalty(v1::GAP_PENALTY_NONE);
  c.set_penalty_lambda(1.0f);
  c.set_clip(v1::CLIP_NONE);
  c.set_clip_value(3.0f);
  c.set_downlink_codec(v1::CODEC_FP32);
  c.set_tau(8);
  c.set_min_workers(1);
  c.set_round_timeout_ms(60000);
  c.set_max_staleness(1);
  c.set_outlier_ratio(kDefaultOutlierRatio);
  return c;
}

absl::Status ValidateJobConfig(const v1::JobConfig& c) {
  if (c.protocol_version() != kProtocolVersion) {
    return Invalid("protocol_version", absl::StrCat("must be ", kProtocolVersion),
                   c.protocol_version());
  }
  if (c.num_parameters() == 0) {
    return Invalid("num_parameters", "must be > 0", 0);
  }
  if (c.num_shards() == 0) return Invalid("num_shards", "must be > 0", 0);
  // Shards own whole blocks (common/layout.h): with more shards than blocks
  // some shard would own nothing, and no round could close on it.
  const uint64_t blocks =
      (c.num_parameters() + kBlockElements - 1) / kBlockElements;
  if (c.num_shards() > blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "JobConfig.num_shards ", c.num_shards(), " is more than the ", blocks,
        " block(s) of ", kBlockElements, " parameters that num_parameters ",
        c.num_parameters(), " makes: every shard needs a block; use at most ",
        blocks, " shard(s) for this model"));
  }
  // Every float field, used by the chosen penalty and clip or not: the config
  // is compared and logged whole, and a NaN is never equal to itself.
  const std::pair<const char*, float> floats[] = {
      {"alpha", c.alpha()},
      {"beta", c.beta()},
      {"penalty_lambda", c.penalty_lambda()},
      {"clip_value", c.clip_value()},
      {"outlier_ratio", c.outlier_ratio()}};
  for (const auto& [name, value] : floats) {
    if (!std::isfinite(value)) {
      return Invalid(name, "must be finite (even when unused)", value);
    }
  }
  // Non-finite values were refused above.
  if (c.alpha() <= 0) {
    return Invalid("alpha", "must be finite and > 0", c.alpha());
  }
  if (!(c.beta() >= 0 && c.beta() < 1)) {
    return Invalid("beta", "must be in [0, 1)", c.beta());
  }
  switch (c.momentum()) {
    case v1::MOMENTUM_HEAVY_BALL:
    case v1::MOMENTUM_NESTEROV:
      if (c.momentum_period() != 0) {
        return Invalid("momentum_period",
                       "must be 0 unless momentum is DELAYED_NESTEROV",
                       c.momentum_period());
      }
      break;
    case v1::MOMENTUM_DELAYED_NESTEROV:
      if (c.momentum_period() == 0) {
        return Invalid("momentum_period",
                       "must be >= 1 with DELAYED_NESTEROV momentum", 0);
      }
      break;
    default:
      return Invalid("momentum",
                     "must be HEAVY_BALL, NESTEROV or DELAYED_NESTEROV",
                     c.momentum());
  }
  switch (c.gap_penalty()) {
    case v1::GAP_PENALTY_NONE:
    case v1::GAP_PENALTY_GAP_AWARE:
      break;
    case v1::GAP_PENALTY_CONSTANT:
      if (c.penalty_lambda() < 1) {
        return Invalid("penalty_lambda", "must be finite and >= 1",
                       c.penalty_lambda());
      }
      break;
    default:
      return Invalid("gap_penalty", "must be NONE, CONSTANT or GAP_AWARE",
                     c.gap_penalty());
  }
  switch (c.clip()) {
    case v1::CLIP_NONE:
      break;
    case v1::CLIP_VALUE:
    case v1::CLIP_ADAPTIVE:
      if (c.clip_value() <= 0) {
        return Invalid("clip_value", "must be finite and > 0", c.clip_value());
      }
      break;
    default:
      return Invalid("clip", "must be NONE, VALUE or ADAPTIVE", c.clip());
  }
  if (!IsKnownCodec(c.downlink_codec())) {
    return Invalid("downlink_codec", "must be FP32, BF16 or INT8",
                   c.downlink_codec());
  }
  if (c.outlier_ratio() < 0) {
    return Invalid("outlier_ratio", "must be >= 0 (0: off)", c.outlier_ratio());
  }
  if (c.min_workers() == 0) return Invalid("min_workers", "must be >= 1", 0);
  if (c.round_timeout_ms() == 0) {
    return Invalid("round_timeout_ms", "must be > 0", 0);
  }
  if (c.max_staleness() > 1) {
    return Invalid("max_staleness", "must be 0 or 1", c.max_staleness());
  }
  return absl::OkStatus();
}

absl::Status CheckSameJobConfig(const v1::JobConfig& job,
                                const v1::JobConfig& requested) {
  google::protobuf::util::MessageDifferencer differ;
  std::string report;
  differ.ReportDifferencesToString(&report);
  if (differ.Compare(job, requested)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "JobConfig differs from the job's (fixed by its first Join): ", report,
      "job has {", DescribeJobConfig(job), "}"));
}

absl::StatusOr<v1::GapPenalty> ParseGapPenalty(absl::string_view name) {
  if (name == "none") return v1::GAP_PENALTY_NONE;
  if (name == "constant") return v1::GAP_PENALTY_CONSTANT;
  if (name == "gap_aware") return v1::GAP_PENALTY_GAP_AWARE;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown gap penalty \"", name, "\" (none, constant, gap_aware)"));
}

absl::StatusOr<v1::Clip> ParseClip(absl::string_view name) {
  if (name == "none") return v1::CLIP_NONE;
  if (name == "value") return v1::CLIP_VALUE;
  if (name == "adaptive") return v1::CLIP_ADAPTIVE;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown clip mode \"", name, "\" (none, value, adaptive)"));
}

absl::StatusOr<v1::Momentum> ParseMomentum(absl::string_view name) {
  if (name == "heavy_ball") return v1::MOMENTUM_HEAVY_BALL;
  if (name == "nesterov") return v1::MOMENTUM_NESTEROV;
  if (name == "delayed_nesterov") return v1::MOMENTUM_DELAYED_NESTEROV;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown momentum \"", name,
                   "\" (heavy_ball, nesterov, delayed_nesterov)"));
}

std::string DescribeJobConfig(const v1::JobConfig& c) {
  return absl::StrCat(
      "P=", c.num_parameters(), " S=", c.num_shards(), " alpha=", c.alpha(),
      " beta=", c.beta(), " momentum=", v1::Momentum_Name(c.momentum()),
      " momentum_period=", c.momentum_period(),
      " penalty=", v1::GapPenalty_Name(c.gap_penalty()),
      " lambda=", c.penalty_lambda(), " clip=", v1::Clip_Name(c.clip()),
      " clip_value=", c.clip_value(),
      " downlink=", v1::Codec_Name(c.downlink_codec()), " tau=", c.tau(),
      " min_workers=", c.min_workers(),
      " round_timeout_ms=", c.round_timeout_ms(),
      " max_staleness=", c.max_staleness(), " rounds=", c.rounds(),
      " deterministic=", c.deterministic(),
      " outlier_ratio=", c.outlier_ratio());
}

}  // namespace co2::common
