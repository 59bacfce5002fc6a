// End to end over real gRPC on loopback: S shard servers in this process,
// N worker threads with AggregatorClient, the CO2 boundary protocol, and a
// reference computation of the anchor trajectory.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/aggregator_client.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "server/aggregator_server.h"
#include "server/outer_optimizer.h"

namespace co2 {
namespace {

constexpr size_t kParams = (1 << 20) + 12345;  // > 1M, last shard ragged
constexpr uint32_t kShards = 2;
constexpr int kWorkers = 4;
constexpr uint64_t kRounds = 20;

// Worker i's pseudo-gradient of round r: small multiples of 2^-10, so every
// weighted sum on the shard is exact and the mean does not depend on the
// order in which chunks arrive.
float Delta(int worker, uint64_t round, size_t j) {
  const int v = static_cast<int>((j * 7 + worker * 13 + round * 5) % 17) - 8;
  return static_cast<float>(v) / 1024.0f;
}
double Weight(int worker) { return worker + 1; }
float Initial(size_t j) { return static_cast<float>(j % 101) / 64.0f; }

struct Cluster {
  std::vector<std::unique_ptr<server::AggregatorServer>> shards;
  std::vector<std::string> addresses;

  explicit Cluster(uint32_t num_shards) {
    for (uint32_t i = 0; i < num_shards; ++i) {
      server::AggregatorServerOptions options;
      options.address = "127.0.0.1:0";
      options.registry.shard_index = i;
      options.registry.num_shards = num_shards;
      auto s = server::AggregatorServer::Start(options);
      EXPECT_TRUE(s.ok()) << s.status();
      addresses.push_back(absl::StrCat("127.0.0.1:", (*s)->port()));
      shards.push_back(*std::move(s));
    }
  }

  // The full anchor, assembled from the shards, and its round.
  std::vector<float> Anchor(const std::string& job, uint64_t* round) {
    std::vector<float> anchor;
    for (auto& shard : shards) {
      auto js = shard->registry()->Find(job);
      EXPECT_TRUE(js.ok()) << js.status();
      std::vector<float> part = (*js)->AnchorForTesting(round);
      anchor.insert(anchor.end(), part.begin(), part.end());
    }
    return anchor;
  }
};

v1::JobConfig Co2Config(v1::Codec downlink) {
  v1::JobConfig config = common::DefaultJobConfig(kParams, kShards);
  config.set_alpha(0.8f);
  config.set_beta(0.5f);
  config.set_gap_penalty(v1::GAP_PENALTY_GAP_AWARE);
  config.set_clip(v1::CLIP_ADAPTIVE);
  config.set_clip_value(2.0f);
  config.set_downlink_codec(downlink);
  config.set_min_workers(kWorkers);
  config.set_round_timeout_ms(60000);
  return config;
}

// What the shards must compute, on the whole vector at once: reductions are
// per 65,536-element block and shard ranges are block-aligned, so sharding
// must not change a single bit.
std::vector<float> ReferenceAnchor(const v1::JobConfig& config) {
  server::OuterConfig outer;
  outer.alpha = config.alpha();
  outer.beta = config.beta();
  outer.penalty = server::GapPenalty::kGapAware;
  outer.clip = server::ClipMode::kAdaptive;
  outer.clip_value = config.clip_value();
  const common::Codec codec = common::Codec(config.downlink_codec());
  std::vector<float> anchor(kParams), gap(kParams, 0.0f), m(kParams, 0.0f),
      mean(kParams), update(kParams);
  for (size_t j = 0; j < kParams; ++j) anchor[j] = Initial(j);
  double total_weight = 0;
  for (int w = 0; w < kWorkers; ++w) total_weight += Weight(w);
  for (uint64_t r = 0; r < kRounds; ++r) {
    for (size_t j = 0; j < kParams; ++j) {
      float sum = 0;
      for (int w = 0; w < kWorkers; ++w) {
        sum += static_cast<float>(Weight(w)) * Delta(w, r, j);
      }
      mean[j] = static_cast<float>(sum / total_weight);
    }
    server::OuterStep(outer, mean, gap, absl::MakeSpan(m),
                      absl::MakeSpan(update));
    // Encode chunk by chunk within each shard, as the shards do.
    for (uint32_t s = 0; s < kShards; ++s) {
      const common::Range range = *common::ShardRangeFor(kParams, kShards, s);
      for (size_t c = 0; c < common::NumChunks(range.size()); ++c) {
        const common::Range r2 = common::ChunkRange(range.size(), c);
        auto u = absl::MakeSpan(update).subspan(range.begin + r2.begin, r2.size());
        std::string bytes(common::EncodedSize(codec, u.size()), '\0');
        common::Encode(codec, u, absl::MakeSpan(bytes.data(), bytes.size()));
        common::Decode(codec, bytes, u);
      }
    }
    for (size_t j = 0; j < kParams; ++j) {
      anchor[j] += update[j];
      gap[j] = update[j];
    }
  }
  return anchor;
}

// One worker following the CO2 boundary protocol (design.md §3) for kRounds
// rounds, then draining the last update.
void RunWorker(const std::vector<std::string>& addresses, const std::string& job,
               const v1::JobConfig& config, common::Codec uplink, int worker,
               std::vector<float>* anchor_out, absl::Status* status_out) {
  auto fail = [&](const absl::Status& s) { *status_out = s; };
  std::vector<float> anchor(kParams);
  for (size_t j = 0; j < kParams; ++j) anchor[j] = Initial(j);
  client::ClientOptions options;
  options.addresses = addresses;
  options.job = job;
  options.worker_id = absl::StrCat("worker-", worker);
  options.job_config = config;
  options.uplink_codec = uplink;
  auto connected = client::AggregatorClient::Connect(options, absl::MakeSpan(anchor));
  if (!connected.ok()) return fail(connected.status());
  client::AggregatorClient& c = **connected;
  if (c.start_round() != 0) {
    return fail(absl::InternalError("fresh job must start at round 0"));
  }
  std::vector<float> delta(kParams);
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  for (uint64_t r = 0; r < kRounds; ++r) {
    for (size_t j = 0; j < kParams; ++j) delta[j] = Delta(worker, r, j);
    if (r > 0) {
      if (auto s = c.WaitForUpdate(r - 1, deadline); !s.ok()) return fail(s);
    }
    if (auto s = c.Push(r, delta, Weight(worker), deadline); !s.ok()) {
      return fail(s);
    }
    if (r > 0) {
      auto applied = c.ApplyUpdate(r - 1, absl::MakeSpan(anchor));
      if (!applied.ok()) return fail(applied.status());
      if (*applied != r + 1) {
        return fail(absl::InternalError(absl::StrCat(
            "update of round ", r - 1, " gave anchor round ", *applied)));
      }
    }
  }
  if (auto s = c.WaitForUpdate(kRounds - 1, deadline); !s.ok()) return fail(s);
  if (auto a = c.ApplyUpdate(kRounds - 1, absl::MakeSpan(anchor)); !a.ok()) {
    return fail(a.status());
  }
  const client::ClientStats stats = c.stats();
  if (stats.rounds_pushed != kRounds || stats.updates_received != kRounds) {
    return fail(absl::InternalError(absl::StrCat(
        "pushed ", stats.rounds_pushed, " received ", stats.updates_received)));
  }
  if (auto s = c.Leave(absl::Now() + absl::Seconds(10)); !s.ok()) {
    return fail(s);
  }
  *anchor_out = std::move(anchor);
}

class AggregatorE2eTest : public testing::TestWithParam<v1::Codec> {};

TEST_P(AggregatorE2eTest, WorkersAndShardsHoldTheReferenceAnchor) {
  Cluster cluster(kShards);
  const v1::JobConfig config = Co2Config(GetParam());
  std::vector<std::vector<float>> anchors(kWorkers);
  std::vector<absl::Status> statuses(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back(RunWorker, cluster.addresses, "e2e", config,
                         common::Codec::kFp32, w, &anchors[w], &statuses[w]);
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(statuses[w].ok()) << statuses[w];

  uint64_t round = 0;
  const std::vector<float> server_anchor = cluster.Anchor("e2e", &round);
  EXPECT_EQ(round, kRounds + 1);
  const std::vector<float> reference = ReferenceAnchor(config);
  ASSERT_EQ(server_anchor.size(), kParams);
  size_t mismatches = 0;
  for (size_t j = 0; j < kParams; ++j) {
    if (std::memcmp(&server_anchor[j], &reference[j], sizeof(float)) != 0 &&
        mismatches++ < 5) {
      ADD_FAILURE() << "element " << j << ": shard " << server_anchor[j]
                    << " reference " << reference[j];
    }
  }
  EXPECT_EQ(mismatches, 0u);
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_EQ(anchors[w].size(), kParams);
    EXPECT_EQ(std::memcmp(anchors[w].data(), server_anchor.data(),
                          kParams * sizeof(float)),
              0)
        << "worker " << w << " anchor differs from the shards'";
  }
  // The trajectory moved: the test would notice updates that were dropped.
  double moved = 0;
  for (size_t j = 0; j < kParams; j += 97) moved += std::fabs(reference[j] - Initial(j));
  EXPECT_GT(moved, 1.0);
}

INSTANTIATE_TEST_SUITE_P(Downlink, AggregatorE2eTest,
                         testing::Values(v1::CODEC_FP32, v1::CODEC_BF16,
                                         v1::CODEC_INT8),
                         [](const auto& info) {
                           return v1::Codec_Name(info.param);
                         });

TEST(AggregatorE2eTest, LossyUplinkKeepsAnchorsIdentical) {
  Cluster cluster(kShards);
  const v1::JobConfig config = Co2Config(v1::CODEC_BF16);
  std::vector<std::vector<float>> anchors(kWorkers);
  std::vector<absl::Status> statuses(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back(RunWorker, cluster.addresses, "lossy", config,
                         w % 2 ? common::Codec::kInt8 : common::Codec::kBf16, w,
                         &anchors[w], &statuses[w]);
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(statuses[w].ok()) << statuses[w];
  uint64_t round = 0;
  const std::vector<float> server_anchor = cluster.Anchor("lossy", &round);
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(std::memcmp(anchors[w].data(), server_anchor.data(),
                          kParams * sizeof(float)),
              0)
        << "worker " << w;
  }
}

}  // namespace
}  // namespace co2
