// End to end over real gRPC on loopback: 2 shard servers in this process,
// 4 worker threads with AggregatorClient following the CO2 boundary protocol
// for 20 rounds of > 1M parameters, checked bit for bit against a reference
// computation of the anchor trajectory.
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/layout.h"
#include "gmock/gmock.h"
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

// A node's local ranks each exchange their own shards' slice (S = 4 shards,
// L = 2 and 4 ranks, and S = 3 over L = 2, whose slices are unequal): the
// shards see one member per worker and compute what a leader-only
// exchange of the whole model makes them compute, bit for bit.
class SlicedE2eTest
    : public ::testing::TestWithParam<std::pair<uint32_t, uint32_t>> {};

TEST_P(SlicedE2eTest, RanksExchangingTheirSlicesHoldTheReferenceAnchor) {
  E2eSpec spec;
  spec.shards = GetParam().first;
  spec.workers = 2;
  spec.rounds = 6;
  Cluster cluster(spec.shards);
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_INT8);
  std::vector<WorkerResult> results =
      RunSlicedWorkers(spec, cluster.addresses(), "sliced", config,
                       common::Codec::kInt8, GetParam().second);
  for (const WorkerResult& r : results) CO2_ASSERT_OK(r.status);
  uint64_t round = 0;
  const std::vector<float> shards = cluster.Anchor("sliced", &round);
  EXPECT_EQ(round, spec.rounds + 1);
  std::vector<WorkerResult> whole =
      RunWorkers(spec, cluster.addresses(), "whole", config,
                 [](int) { return common::Codec::kInt8; });
  for (const WorkerResult& r : whole) CO2_ASSERT_OK(r.status);
  ExpectIdentical(shards, whole[0].anchor, "sliced shards vs leader-only");
  for (const WorkerResult& r : results) {
    ExpectIdentical(r.anchor, shards, "sliced worker vs shards");
  }
}

// A client owning shards [1, 3) of 4 joins, seeds and fetches those two
// and no other: shards 0 and 3 never hear of the job.
TEST(SlicedClientTest, TouchesOnlyTheShardsItOwns) {
  E2eSpec spec;
  spec.shards = 4;
  spec.workers = 1;
  Cluster cluster(spec.shards);
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  const common::Range slice{
      common::ShardRangeFor(spec.params, 4, 1)->begin,
      common::ShardRangeFor(spec.params, 4, 2)->end};
  const std::vector<float> initial = InitialAnchor(spec.params);
  std::vector<float> mine(initial.begin() + slice.begin,
                          initial.begin() + slice.end);
  client::ClientOptions options =
      WorkerOptions(cluster.addresses(), "owned", config, 0);
  options.owned_shards = common::Range{1, 3};
  options.num_parameters = spec.params;
  auto seeder = client::AggregatorClient::Connect(options, absl::MakeSpan(mine));
  CO2_ASSERT_OK(seeder.status());
  EXPECT_EQ((*seeder)->slice(), slice);
  EXPECT_FALSE(cluster.registry(0)->Find("owned").ok());
  EXPECT_FALSE(cluster.registry(3)->Find("owned").ok());
  for (uint32_t i : {1u, 2u}) {
    auto job = cluster.registry(i)->Find("owned");
    CO2_ASSERT_OK(job.status());
    uint64_t round = 1;
    const std::vector<float> held = (*job)->AnchorForTesting(&round);
    const common::Range r = *common::ShardRangeFor(spec.params, 4, i);
    EXPECT_EQ(round, 0u);
    ASSERT_EQ(held.size(), r.size());
    EXPECT_EQ(0, std::memcmp(held.data(), initial.data() + r.begin,
                             r.size() * sizeof(float)))
        << "shard " << i << " was seeded with another range";
  }
  // A second worker fetches the slice: it gets the seeded values.
  std::vector<float> fetched(slice.size(), -1.0f);
  options.worker_id = "worker-1";
  auto fetcher =
      client::AggregatorClient::Connect(options, absl::MakeSpan(fetched));
  CO2_ASSERT_OK(fetcher.status());
  ExpectIdentical(fetched, mine, "fetched slice vs seeded");
  EXPECT_FALSE(cluster.registry(0)->Find("owned").ok());
}

void ExpectRefused(const client::ClientOptions& options,
                   std::vector<float>& anchor, const std::string& why) {
  const absl::Status status =
      client::AggregatorClient::Connect(options, absl::MakeSpan(anchor))
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr(why));
}

TEST(SlicedClientTest, RefusesASliceItCannotServe) {
  E2eSpec spec;
  spec.shards = 4;
  Cluster cluster(spec.shards);
  const v1::JobConfig config = Co2Config(spec, v1::CODEC_FP32);
  client::ClientOptions options =
      WorkerOptions(cluster.addresses(), "refused", config, 0);
  options.owned_shards = common::Range{1, 3};
  std::vector<float> whole = InitialAnchor(spec.params);
  ExpectRefused(options, whole, "needs num_parameters");
  options.num_parameters = spec.params;
  ExpectRefused(options, whole, "shards [1, 3) of 4 serve [");
  options.owned_shards = common::Range{3, 5};
  ExpectRefused(options, whole, "owned_shards [3, 5) is not");
}

INSTANTIATE_TEST_SUITE_P(
    ShardsAndRanks, SlicedE2eTest,
    ::testing::Values(std::pair<uint32_t, uint32_t>{4, 2},
                      std::pair<uint32_t, uint32_t>{4, 4},
                      std::pair<uint32_t, uint32_t>{3, 2}),
    [](const auto& info) {
      return absl::StrCat("S", info.param.first, "L", info.param.second);
    });

}  // namespace
}  // namespace co2::testing
