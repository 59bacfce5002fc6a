// The JobConfig of co2.v1 (the one definition of a job's outer-step settings,
// fixed by its first Join): defaults, validation, and parsing of the names
// users type on command lines. Pure functions; any thread.
#ifndef CO2_COMMON_JOB_CONFIG_H_
#define CO2_COMMON_JOB_CONFIG_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "co2/v1/aggregator.pb.h"

namespace co2::common {

inline constexpr uint32_t kProtocolVersion = 2;
// JobConfig.outlier_ratio of DefaultJobConfig, co2-train and co2.JobConfig:
// far above what healthy jobs show (docs/algorithm.md, "Robust rounds").
inline constexpr float kDefaultOutlierRatio = 20;

// The defaults documented in docs/: CO2 with staleness 1, α = 1, β = 0,
// heavy ball, no penalty, no clipping, fp32 downlink.
v1::JobConfig DefaultJobConfig(uint64_t num_parameters, uint32_t num_shards);

// INVALID_ARGUMENT naming the field and value for anything out of range.
absl::Status ValidateJobConfig(const v1::JobConfig& config);

// FAILED_PRECONDITION naming the first field that differs, for a Join whose
// config does not match the job's.
absl::Status CheckSameJobConfig(const v1::JobConfig& job,
                                const v1::JobConfig& requested);

// "none" | "constant" | "gap_aware".
absl::StatusOr<v1::GapPenalty> ParseGapPenalty(absl::string_view name);
// "none" | "value" | "adaptive".
absl::StatusOr<v1::Clip> ParseClip(absl::string_view name);
// "heavy_ball" | "nesterov" | "delayed_nesterov".
absl::StatusOr<v1::Momentum> ParseMomentum(absl::string_view name);

// One line, for logs: "P=... S=... alpha=... beta=... ...".
std::string DescribeJobConfig(const v1::JobConfig& config);

}  // namespace co2::common

#endif  // CO2_COMMON_JOB_CONFIG_H_
