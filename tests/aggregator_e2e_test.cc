// End to end over real gRPC on loopback: 2 shard servers in this process,
// 4 worker threads with AggregatorClient following the CO2 boundary protocol
// for 20 rounds of > 1M parameters, checked bit for bit against a reference
// computation of the anchor trajectory.
#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tests/e2e_harness.h"
#include "tests/status_matchers.h"

namespace co2::testing {
namespace {

void ExpectIdentical(const std::vector<float>& a, const std::vector<float>& b,
                     const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t mismatches = 0;
  for (size_t j = 0; j < a.size(); ++j) {
    if (std::memcmp(&a[j], &b[j], sizeof(float)) != 0 && mismatches++ < 3) {
      ADD_FAILURE() << what << ": element " << j << ": " << a[j] << " vs " << b[j];
    }
  }
  EXPECT_EQ(mismatches, 0u) << what;
}

class AggregatorE2eTest : public ::testing::TestWithParam<v1::Codec> {};

TEST_P(AggregatorE2eTest, WorkersAndShardsHoldTheReferenceAnchor) {
  const E2eSpec spec;
  Cluster cluster(spec.shards);
  const v1::JobConfig config = Co2Config(spec, GetParam());
  std::vector<WorkerResult> results =
      RunWorkers(spec, cluster.addresses(), "e2e", config,
                 [](int) { return common::Codec::kFp32; });
  for (const WorkerResult& r : results) CO2_ASSERT_OK(r.status);

  uint64_t round = 0;
  const std::vector<float> shards = cluster.Anchor("e2e", &round);
  EXPECT_EQ(round, spec.rounds + 1);
  const std::vector<float> reference = ReferenceAnchor(spec, config);
  ExpectIdentical(shards, reference, "shards vs reference");
  for (int w = 0; w < spec.workers; ++w) {
    ExpectIdentical(results[w].anchor, shards, "worker vs shards");
  }
  // The trajectory moved: dropped updates would be noticed.
  double moved = 0;
  for (size_t j = 0; j < spec.params; j += 97) {
    moved += std::fabs(reference[j] - Initial(j));
  }
  EXPECT_GT(moved, 1.0);
}

INSTANTIATE_TEST_SUITE_P(Downlink, AggregatorE2eTest,
                         ::testing::Values(v1::CODEC_FP32, v1::CODEC_BF16,
                                           v1::CODEC_INT8),
                         [](const auto& info) {
                           return v1::Codec_Name(info.param);
                         });

TEST(AggregatorE2eTest, LossyUplinkKeepsAnchorsIdentical) {
  const E2eSpec spec;
  Cluster cluster(spec.shards);
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_BF16);
  std::vector<WorkerResult> results =
      RunWorkers(spec, cluster.addresses(), "lossy", config, [](int w) {
        return w % 2 ? common::Codec::kInt8 : common::Codec::kBf16;
      });
  for (const WorkerResult& r : results) CO2_ASSERT_OK(r.status);
  uint64_t round = 0;
  const std::vector<float> shards = cluster.Anchor("lossy", &round);
  for (const WorkerResult& r : results) {
    ExpectIdentical(r.anchor, shards, "worker vs shards");
  }
}

}  // namespace
}  // namespace co2::testing
