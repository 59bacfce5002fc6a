// What the JobShard tests share: a small one-shard job whose outer step is
// plain (α = 1, β = 0, no penalty, no clip), so each closed round moves the
// anchor by exactly −mean Δ; contributions whose payload is one constant; a
// shard with its workers joined and its anchor seeded; a sink that records
// the rounds it is sent.
#ifndef CO2_TESTS_JOB_SHARD_FIXTURE_H_
#define CO2_TESTS_JOB_SHARD_FIXTURE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "co2/v1/aggregator.pb.h"
#include "common/clock.h"
#include "server/job/job_shard.h"

namespace co2::server::shard_test {

inline constexpr size_t kParams = 1000;  // the job's parameters, one chunk

// The plain job: round timeout 1 s, quorum `min_workers`.
v1::JobConfig Config(uint32_t min_workers = 1);
// kParams fp32 floats, all `value`.
std::string Fp32(float value);
// Chunk 0 of `round`, fp32, every element `value`.
v1::Contribution Contribution(uint64_t round, float value, double weight = 1);

// Job "job" with `config` and `options`, `workers` joined (fp32 uplink), and
// the anchor seeded by the first worker with every element `anchor`.
absl::StatusOr<std::unique_ptr<JobShard>> SeededShard(
    const v1::JobConfig& config, const JobShardOptions& options,
    common::Clock* clock, const std::vector<std::string>& workers,
    float anchor = 10);

// Records the rounds whose update it was sent whole (in one Send, or in
// several as the shard streamed its chunks), and the rounds replayed to it.
class RecordingSink : public UpdateSink {
 public:
  void Send(std::shared_ptr<const UpdateChunks> update) override {
    for (const auto& chunk : *update) {
      if (++chunks_of_[chunk->round()] == chunk->num_chunks()) {
        rounds.push_back(chunk->round());
      }
    }
  }
  void Replay(const KeptUpdate& update) override {
    replayed.push_back(update.round());
  }
  std::vector<uint64_t> rounds;
  std::vector<uint64_t> replayed;

 private:
  std::map<uint64_t, uint32_t> chunks_of_;
};

}  // namespace co2::server::shard_test

#endif  // CO2_TESTS_JOB_SHARD_FIXTURE_H_
