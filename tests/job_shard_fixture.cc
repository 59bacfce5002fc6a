#include "tests/job_shard_fixture.h"

#include <utility>

#include "common/codec.h"
#include "common/job_config.h"
#include "common/status_macros.h"

namespace co2::server::shard_test {

v1::JobConfig Config(uint32_t min_workers) {
  v1::JobConfig c = common::DefaultJobConfig(kParams, 1);
  c.set_alpha(1.0f);
  c.set_beta(0.0f);
  c.set_gap_penalty(v1::GAP_PENALTY_NONE);
  c.set_clip(v1::CLIP_NONE);
  c.set_min_workers(min_workers);
  c.set_round_timeout_ms(1000);
  return c;
}

std::string Fp32(float value) {
  std::vector<float> v(kParams, value);
  std::string bytes(kParams * sizeof(float), '\0');
  common::Encode(common::Codec::kFp32, v,
                 absl::MakeSpan(bytes.data(), bytes.size()));
  return bytes;
}

v1::Contribution Contribution(uint64_t round, float value, double weight) {
  v1::Contribution c;
  c.set_round(round);
  c.set_chunk_index(0);
  c.set_codec(v1::CODEC_FP32);
  c.set_weight(weight);
  c.set_payload(Fp32(value));
  return c;
}

absl::StatusOr<std::unique_ptr<JobShard>> SeededShard(
    const v1::JobConfig& config, const JobShardOptions& options,
    common::Clock* clock, const std::vector<std::string>& workers,
    float anchor) {
  CO2_ASSIGN_OR_RETURN(std::unique_ptr<JobShard> shard,
                       JobShard::Create("job", config, options, clock));
  for (const std::string& w : workers) {
    CO2_RETURN_IF_ERROR(
        shard->Join(w, config, common::Codec::kFp32).status());
  }
  CO2_RETURN_IF_ERROR(shard->SeedChunk(workers[0], 0, 0, Fp32(anchor)));
  return shard;
}

}  // namespace co2::server::shard_test
