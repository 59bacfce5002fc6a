// Rank slices (client/training/co2_optimizer.h): 2 workers × 2 local ranks
// in threads, each rank exchanging its own shards' slice of the model over
// real gRPC with in-process shards and a Gloo group per node. A
// deterministic job ends bit-identical to the same job exchanged by the
// local leaders alone; each rank holds and sends its slice only; the ranks
// of a node apply an arrived update at the same step; a setup that is
// neither leader-only nor slices is refused by name.
#include <torch/torch.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/aggregator_client.h"
#include "client/collectives/process_group.h"
#include "client/training/co2_optimizer.h"
#include "client/training/flat_params.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_harness.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2::client {
namespace {

using ::co2::testing::Cluster;
using ::co2::testing::TempDir;

constexpr int kWorkers = 2;
constexpr int kRanks = 2;
constexpr int kTau = 3;
constexpr uint64_t kRounds = 4;
// Four blocks and a ragged end: every shard of 2 or 4 holds a block or more.
constexpr int64_t kParams = 4 * 65536 + 777;

enum class Mode { kLeaderOnly, kSlices };

struct JobSetup {
  Mode mode = Mode::kSlices;
  bool deterministic = true;
  // Which local ranks get a client (by default: the leader, or all).
  std::function<bool(int rank)> has_client;
};

struct RankRun {
  std::string error;
  std::vector<float> params;  // after Finish
  uint64_t bytes_sent = 0;
  MemoryReport memory;
  std::vector<int> applied_after_steps;  // per round
  bool rank_slices = false;
};

ClientOptions Options(const Cluster& cluster, const std::string& job,
                      int worker, bool deterministic) {
  ClientOptions options;
  options.addresses = cluster.addresses();
  options.job = job;
  options.worker_id = absl::StrCat("worker-", worker);
  options.job_config = common::DefaultJobConfig(0, 0);
  options.job_config.set_alpha(0.8f);
  options.job_config.set_beta(0.5f);
  options.job_config.set_max_staleness(1);
  options.job_config.set_tau(kTau);
  options.job_config.set_rounds(kRounds);
  options.job_config.set_min_workers(kWorkers);
  options.job_config.set_downlink_codec(v1::CODEC_INT8);
  options.job_config.set_deterministic(deterministic);
  options.uplink_codec = common::Codec::kInt8;
  options.num_parameters = kParams;
  options.connect_timeout = absl::Seconds(30);
  return options;
}

// One local rank: a weight of kParams elements whose gradient depends on
// the worker, the rank and the element, trained with SGD for kRounds rounds.
RankRun RunRank(const Cluster& cluster, const std::string& job,
                const JobSetup& setup, const std::string& store, int worker,
                int rank) {
  RankRun out;
  GroupOptions g;
  g.rank = rank;
  g.size = kRanks;
  g.store_dir = store;
  g.prefix = absl::StrCat("node-", worker);
  g.timeout = absl::Seconds(60);
  auto group = CreateProcessGroup(g);
  if (!group.ok()) return out.error = group.status().ToString(), out;
  torch::Tensor w =
      torch::arange(kParams, torch::kFloat).div(kParams).requires_grad_(true);
  auto flat = FlatParams::Create({w});
  if (!flat.ok()) return out.error = flat.status().ToString(), out;
  torch::optim::SGD inner({w}, torch::optim::SGDOptions(0.05));
  std::unique_ptr<AggregatorClient> client;
  const bool has_client =
      setup.has_client ? setup.has_client(rank)
                       : setup.mode == Mode::kSlices || rank == 0;
  if (has_client) {
    ClientOptions options =
        Options(cluster, job, worker, setup.deterministic);
    absl::Span<float> anchor = (*flat)->ParamSpan();
    if (setup.mode == Mode::kSlices) {
      options.owned_shards =
          *common::OwnedShards(cluster.addresses().size(), kRanks, rank);
      const common::Range slice = *common::RankRange(
          kParams, cluster.addresses().size(), kRanks, rank);
      anchor = anchor.subspan(slice.begin, slice.size());
    }
    auto c = AggregatorClient::Connect(options, anchor);
    if (!c.ok()) return out.error = c.status().ToString(), out;
    client = std::move(*c);
  }
  Co2OptimizerOptions options;
  options.algo = Algo::kCo2;
  options.tau = kTau;
  options.rounds = kRounds;
  options.uplink_codec = common::Codec::kInt8;
  auto opt = Co2Optimizer::Create(options, flat->get(), &inner,
                                  std::move(client), group->get(), nullptr);
  if (!opt.ok()) return out.error = opt.status().ToString(), out;
  const torch::Tensor c =
      torch::arange(kParams, torch::kFloat).fmod(7 + worker + rank).sub(3);
  for (uint64_t step = 0; step < kRounds * kTau; ++step) {
    (*opt)->ZeroGrad();
    (w * w * c).sum().backward();
    if (absl::Status s = (*opt)->Step(); !s.ok()) {
      return out.error = s.ToString(), out;
    }
  }
  if (absl::Status s = (*opt)->Finish(); !s.ok()) {
    return out.error = s.ToString(), out;
  }
  out.params.assign(w.data_ptr<float>(), w.data_ptr<float>() + kParams);
  out.bytes_sent = (*opt)->bytes_sent();
  out.memory = (*opt)->Memory();
  out.rank_slices = (*opt)->rank_slices();
  for (const RoundStats& r : (*opt)->rounds()) {
    out.applied_after_steps.push_back(r.applied_after_steps);
  }
  return out;
}

// Every rank of every worker, each on a thread; [worker][rank].
std::vector<std::vector<RankRun>> RunJob(const Cluster& cluster,
                                         const std::string& job,
                                         const JobSetup& setup) {
  TempDir store;
  std::vector<std::vector<RankRun>> runs(kWorkers,
                                         std::vector<RankRun>(kRanks));
  std::vector<std::thread> threads;
  for (int worker = 0; worker < kWorkers; ++worker) {
    for (int rank = 0; rank < kRanks; ++rank) {
      threads.emplace_back([&, worker, rank] {
        runs[worker][rank] =
            RunRank(cluster, job, setup, store.path(), worker, rank);
      });
    }
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class RankSlicesTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(RankSlicesTest, EndBitIdenticalToTheLeaderAloneWithASliceEach) {
  const uint32_t shards = GetParam();
  Cluster cluster(shards);
  const auto sliced = RunJob(cluster, "sliced", JobSetup{Mode::kSlices});
  const auto leader = RunJob(cluster, "leader", JobSetup{Mode::kLeaderOnly});
  for (int worker = 0; worker < kWorkers; ++worker) {
    for (int rank = 0; rank < kRanks; ++rank) {
      ASSERT_EQ(sliced[worker][rank].error, "") << worker << "/" << rank;
      ASSERT_EQ(leader[worker][rank].error, "") << worker << "/" << rank;
    }
  }
  const std::vector<float>& reference = leader[0][0].params;
  for (int worker = 0; worker < kWorkers; ++worker) {
    for (int rank = 0; rank < kRanks; ++rank) {
      const RankRun& run = sliced[worker][rank];
      SCOPED_TRACE(absl::StrCat("worker ", worker, " rank ", rank));
      EXPECT_TRUE(run.rank_slices);
      EXPECT_TRUE(SameBits(run.params, reference))
          << "the sliced job's model differs from the leader-only job's";
      const common::Range slice =
          *common::RankRange(kParams, shards, kRanks, rank);
      // A, its carried offset: the slice's floats, no more.
      EXPECT_EQ(run.memory.anchor, 2 * slice.size() * sizeof(float));
      EXPECT_LT(run.bytes_sent, leader[worker][0].bytes_sent * 6 / 10);
      EXPECT_GT(run.bytes_sent, leader[worker][0].bytes_sent * 4 / 10);
    }
    EXPECT_EQ(leader[worker][1].bytes_sent, 0u);
    EXPECT_EQ(sliced[worker][0].bytes_sent + sliced[worker][1].bytes_sent,
              leader[worker][0].bytes_sent);
  }
  // The model moved: a lost update would show.
  EXPECT_NE(reference[kParams / 3],
            static_cast<float>(kParams / 3) / kParams);
}

INSTANTIATE_TEST_SUITE_P(Shards, RankSlicesTest, ::testing::Values(2u, 4u),
                         [](const auto& info) {
                           return absl::StrCat("S", info.param);
                         });

// Applying on arrival, the ranks of a node apply the owed update at the
// same step of every round, and the workers end on one anchor.
TEST(RankSlicesTest, RanksApplyAnArrivedUpdateAtTheSameStep) {
  Cluster cluster(2);
  JobSetup setup{Mode::kSlices};
  setup.deterministic = false;
  const auto runs = RunJob(cluster, "arrival", setup);
  for (int worker = 0; worker < kWorkers; ++worker) {
    ASSERT_EQ(runs[worker][0].error, "");
    ASSERT_EQ(runs[worker][1].error, "");
    EXPECT_EQ(runs[worker][0].applied_after_steps,
              runs[worker][1].applied_after_steps);
    EXPECT_TRUE(SameBits(runs[worker][0].params, runs[worker][1].params));
  }
  EXPECT_TRUE(SameBits(runs[0][0].params, runs[1][0].params));
}

TEST(RankSlicesTest, AClientOnSomeRanksOnlyIsRefused) {
  Cluster cluster(2);
  JobSetup setup{Mode::kSlices};
  setup.has_client = [](int rank) { return rank == 1; };
  TempDir store;
  std::vector<RankRun> runs(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      runs[rank] = RunRank(cluster, "refused", setup, store.path(), 0, rank);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(runs[0].error, ::testing::HasSubstr("needs an aggregator client "
                                                  "on the local leader"));
}

}  // namespace
}  // namespace co2::client
