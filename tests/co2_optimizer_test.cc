// Co2Optimizer against real in-process aggregator shards (port 0) and real
// Gloo groups, with workers and local ranks as threads. Closed-form checks
// use constant gradients: parameter w, loss Σ w·c, SGD with lr 1, so every
// inner step moves x by −c exactly and every round's mean Δ is τ·mean(c).
#include "client/training/co2_optimizer.h"

#include <stdlib.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/aggregator_client.h"
#include "client/collectives/process_group.h"
#include "client/training/flat_params.h"
#include "common/job_config.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job/job_registry.h"
#include "server/job/job_shard.h"
#include "server/service/aggregator_server.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"
#include "tests/wait_for.h"

namespace co2::client {
namespace {

using ::co2::testing::TempDir;

class Shards {
 public:
  explicit Shards(int count) {
    for (int i = 0; i < count; ++i) {
      server::AggregatorServerOptions options;
      options.address = "127.0.0.1:0";
      options.registry.shard_index = i;
      options.registry.num_shards = count;
      auto server = server::AggregatorServer::Start(options);
      CO2_EXPECT_OK(server);
      if (!server.ok()) continue;
      addresses_.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
      servers_.push_back(std::move(*server));
    }
  }
  ~Shards() {
    for (auto& s : servers_) s->Shutdown(absl::Seconds(1));
  }
  const std::vector<std::string>& addresses() const { return addresses_; }
  // The round of shard `index`'s anchor of `job` (0 before the job exists).
  uint64_t AnchorRound(int index, const std::string& job) const {
    absl::StatusOr<std::shared_ptr<server::JobShard>> shard =
        servers_[index]->registry()->Find(job);
    uint64_t round = 0;
    if (shard.ok()) (*shard)->AnchorForTesting(&round);
    return round;
  }

 private:
  std::vector<std::unique_ptr<server::AggregatorServer>> servers_;
  std::vector<std::string> addresses_;
};

ClientOptions MakeClientOptions(const Shards& shards, const std::string& job,
                                const std::string& worker, Algo algo,
                                float beta, int tau) {
  ClientOptions options;
  options.addresses = shards.addresses();
  options.job = job;
  options.worker_id = worker;
  options.job_config = common::DefaultJobConfig(0, 0);
  options.job_config.set_alpha(1.0f);
  options.job_config.set_beta(beta);
  options.job_config.set_gap_penalty(v1::GAP_PENALTY_NONE);
  options.job_config.set_clip(v1::CLIP_NONE);
  options.job_config.set_max_staleness(StalenessOf(algo));
  options.job_config.set_tau(tau);
  options.connect_timeout = absl::Seconds(20);
  return options;
}

// The optimizer of a co2 job's only worker (τ = 2, 2 rounds), joined to
// `shards`.
absl::StatusOr<std::unique_ptr<Co2Optimizer>> LoneCo2Worker(
    const Shards& shards, const std::string& job, FlatParams* flat,
    torch::optim::Optimizer* inner, std::optional<bool> carry_progress) {
  CO2_ASSIGN_OR_RETURN(
      std::unique_ptr<AggregatorClient> client,
      AggregatorClient::Connect(
          MakeClientOptions(shards, job, "w0", Algo::kCo2, 0, 2),
          flat->ParamSpan()));
  Co2OptimizerOptions options;
  options.algo = Algo::kCo2;
  options.tau = 2;
  options.rounds = 2;
  options.carry_progress = carry_progress;
  return Co2Optimizer::Create(options, flat, inner, std::move(client), nullptr,
                              nullptr);
}

// Runs body(i) on n threads and joins them.
void RunThreads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(body, i);
  for (auto& t : threads) t.join();
}

// Every element of x equals `value`.
::testing::AssertionResult AllEqual(const torch::Tensor& x, float value) {
  const float lo = x.min().item<float>();
  const float hi = x.max().item<float>();
  if (lo == value && hi == value) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "range [" << lo << ", " << hi << "], expected " << value;
}

// ---------------------------------------------------------------------------
// 1 worker, τ = 1, α = 1, β = 0, localsgd: the same trajectory as the
// unwrapped optimizer.

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(10, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc2->forward(torch::tanh(fc1->forward(x)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

TEST(Co2OptimizerTest, LocalSgdTauOneMatchesUnwrappedOptimizer) {
  Shards shards(1);
  ASSERT_EQ(shards.addresses().size(), 1u);
  torch::manual_seed(7);
  Mlp net;
  torch::manual_seed(7);
  Mlp ref;
  auto flat = FlatParams::Create(net->parameters());
  CO2_ASSERT_OK(flat);
  const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0.01);
  torch::optim::AdamW inner(net->parameters(), adamw);
  torch::optim::AdamW ref_opt(ref->parameters(), adamw);

  auto client = AggregatorClient::Connect(
      MakeClientOptions(shards, "trajectory", "w0", Algo::kLocalSgd, 0, 1),
      (*flat)->ParamSpan());
  CO2_ASSERT_OK(client);
  Co2OptimizerOptions options;
  options.algo = Algo::kLocalSgd;
  options.tau = 1;
  options.samples_per_step = 16;
  auto opt = Co2Optimizer::Create(options, flat->get(), &inner,
                                  std::move(*client), nullptr, nullptr);
  CO2_ASSERT_OK(opt);

  torch::manual_seed(11);
  const torch::Tensor inputs = torch::randn({40, 16, 10});
  const torch::Tensor targets = torch::randint(0, 4, {40, 16});
  for (int step = 0; step < 40; ++step) {
    (*opt)->ZeroGrad();
    ref_opt.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        net->forward(inputs[step]), targets[step]);
    torch::Tensor ref_loss = torch::nn::functional::cross_entropy(
        ref->forward(inputs[step]), targets[step]);
    loss.backward();
    ref_loss.backward();
    CO2_ASSERT_OK((*opt)->Step());
    ref_opt.step();
    EXPECT_NEAR(loss.item<float>(), ref_loss.item<float>(),
                1e-5 * std::abs(ref_loss.item<float>()))
        << "step " << step;
  }
  CO2_ASSERT_OK((*opt)->Finish());
  std::vector<torch::Tensor> ref_params;
  for (const auto& p : ref->parameters()) ref_params.push_back(p.detach().flatten());
  EXPECT_TRUE(torch::allclose((*flat)->params(), torch::cat(ref_params),
                              /*rtol=*/1e-5, /*atol=*/1e-6));
  EXPECT_EQ((*opt)->rounds().size(), 40u);
}

// ---------------------------------------------------------------------------
// 2 workers on 2 shards, constant gradients c = 0.5 and 1.5 (mean 1): after
// each boundary every worker holds the closed-form anchor.

struct ClosedFormCase {
  Algo algo;
  float beta;
  // kArrival: after each round's first step the test waits for the owed
  // update, so the next step at the latest applies it (the gradients are
  // constant, so the progress and the anchors are those of the boundary).
  ApplyAt apply = ApplyAt::kBoundary;
  // With kArrival: Co2OptimizerOptions::apply_by_step; the optimizer itself
  // waits for the owed update after that step, and the test does not.
  int apply_by_step = 0;
};

class ClosedFormTest : public ::testing::TestWithParam<ClosedFormCase> {};

// The anchor after the boundary of each round, and after Finish (last entry).
std::vector<float> ExpectedAnchors(Algo algo, float beta, int tau,
                                   int rounds) {
  const double d = tau * 1.0;  // mean Δ
  double a = 0, m = 0, pending = 0;
  std::vector<float> out;
  for (int r = 0; r < rounds; ++r) {
    if (algo == Algo::kCo2) {
      if (r > 0) a += pending;
      m = beta * m + d;
      pending = -m;
    } else {
      m = beta * m + d;
      a -= m;
    }
    out.push_back(static_cast<float>(a));
  }
  out.push_back(static_cast<float>(algo == Algo::kCo2 ? a + pending : a));
  return out;
}

TEST_P(ClosedFormTest, EveryWorkerHoldsTheClosedFormAnchor) {
  const ClosedFormCase param = GetParam();
  constexpr int kWorkers = 2;
  constexpr int kTau = 4;
  constexpr int kRounds = 6;
  constexpr int64_t kParams = 65536 + 1000;  // spans both shards
  Shards shards(2);
  ASSERT_EQ(shards.addresses().size(), 2u);
  const std::vector<float> expected =
      ExpectedAnchors(param.algo, param.beta, kTau, kRounds);
  const std::string job = absl::StrCat("closed-", AlgoName(param.algo));

  std::vector<std::vector<float>> seen(kWorkers);
  std::vector<std::vector<uint64_t>> hashes(kWorkers);
  std::vector<int> applied_early(kWorkers, 0);
  std::vector<std::vector<int>> applied_after(kWorkers);
  std::vector<std::string> errors(kWorkers);
  std::atomic<int> connected{0};
  RunThreads(kWorkers, [&](int i) {
    torch::Tensor w = torch::zeros({kParams}).requires_grad_(true);
    auto flat = FlatParams::Create({w});
    if (!flat.ok()) return void(errors[i] = flat.status().ToString());
    torch::optim::SGD inner({w}, torch::optim::SGDOptions(1.0));
    auto client = AggregatorClient::Connect(
        MakeClientOptions(shards, job, absl::StrCat("w", i), param.algo,
                          param.beta, kTau),
        (*flat)->ParamSpan());
    if (!client.ok()) return void(errors[i] = client.status().ToString());
    // Both join before either pushes, so both are required for round 0.
    ++connected;
    while (connected.load() < kWorkers) std::this_thread::yield();
    Co2OptimizerOptions options;
    options.algo = param.algo;
    options.tau = kTau;
    options.rounds = kRounds;
    options.hash_params = true;
    options.apply = param.apply;
    options.apply_by_step = param.apply_by_step;
    options.carry_progress = false;  // the closed form is the plain anchor's
    auto opt = Co2Optimizer::Create(options, flat->get(), &inner,
                                    std::move(*client), nullptr, nullptr);
    if (!opt.ok()) return void(errors[i] = opt.status().ToString());
    const torch::Tensor c = torch::full({kParams}, 0.5f + i);
    for (int step = 0; step < kTau * kRounds; ++step) {
      (*opt)->ZeroGrad();
      (w * c).sum().backward();
      absl::Status s = (*opt)->Step();
      if (!s.ok()) return void(errors[i] = s.ToString());
      if (param.apply == ApplyAt::kArrival && param.apply_by_step == 0 &&
          step % kTau == 0) {
        s = (*opt)->AwaitOwedUpdateForTesting();
        if (!s.ok()) return void(errors[i] = s.ToString());
      }
      if (step % kTau == kTau - 1) {
        seen[i].push_back((*flat)->params()[0].item<float>());
        if (!AllEqual((*flat)->params(), seen[i].back())) {
          return void(errors[i] = "parameters differ within a worker");
        }
      }
    }
    absl::Status s = (*opt)->Finish();
    if (!s.ok()) return void(errors[i] = s.ToString());
    seen[i].push_back((*flat)->params()[0].item<float>());
    for (const RoundStats& r : (*opt)->rounds()) {
      hashes[i].push_back(r.params_hash);
      if (r.applied_after_steps > 0) ++applied_early[i];
      applied_after[i].push_back(r.applied_after_steps);
    }
  });
  for (int i = 0; i < kWorkers; ++i) {
    EXPECT_EQ(errors[i], "") << "worker " << i;
    EXPECT_THAT(seen[i], ::testing::ElementsAreArray(expected))
        << "worker " << i;
  }
  EXPECT_EQ(hashes[0], hashes[1]);
  // Every round but the first owes an update, applied before its boundary.
  const int early = param.apply == ApplyAt::kArrival ? kRounds - 1 : 0;
  EXPECT_THAT(applied_early, ::testing::Each(early));
  if (param.apply_by_step > 0) {
    // Each round after the first applied its update after exactly that
    // step (at 1: whether it was back by then or had to be waited for).
    for (int i = 0; i < kWorkers; ++i) {
      ASSERT_GE(applied_after[i].size(), static_cast<size_t>(kRounds));
      for (int r = 1; r < kRounds; ++r) {
        EXPECT_EQ(applied_after[i][r], param.apply_by_step)
            << "worker " << i << " round " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Algos, ClosedFormTest,
    ::testing::Values(ClosedFormCase{Algo::kCo2, 0.0f},
                      ClosedFormCase{Algo::kCo2, 0.5f},
                      ClosedFormCase{Algo::kCo2, 0.5f, ApplyAt::kArrival},
                      ClosedFormCase{Algo::kCo2, 0.5f, ApplyAt::kArrival, 1},
                      ClosedFormCase{Algo::kLocalSgd, 0.0f},
                      ClosedFormCase{Algo::kSlowMo, 0.5f}),
    [](const auto& info) {
      return absl::StrCat(AlgoName(info.param.algo),
                          info.param.beta > 0 ? "_momentum" : "",
                          info.param.apply == ApplyAt::kArrival ? "_arrival"
                                                                : "",
                          info.param.apply_by_step > 0
                              ? absl::StrCat("_by", info.param.apply_by_step)
                              : "");
    });

// ---------------------------------------------------------------------------
// Local ranks and ddp: rank-valued gradients c = rank + 1.

// What one rank thread saw: the parameter value after each boundary (or
// step), or the first error.
struct RankResult {
  std::vector<float> after_boundary;
  std::string error;
};

TEST(Co2OptimizerTest, LocalRanksAverageGradientsAndShareTheAnchor) {
  constexpr int kRanks = 2;
  constexpr int kTau = 3;
  constexpr int kRounds = 3;
  constexpr int64_t kParams = 5000;
  Shards shards(1);
  TempDir store;
  std::vector<RankResult> results(kRanks);
  RunThreads(kRanks, [&](int rank) {
    RankResult& out = results[rank];
    GroupOptions group_options;
    group_options.rank = rank;
    group_options.size = kRanks;
    group_options.store_dir = store.path();
    group_options.prefix = "local";
    group_options.timeout = absl::Seconds(30);
    auto group = CreateProcessGroup(group_options);
    if (!group.ok()) return void(out.error = group.status().ToString());
    torch::Tensor w = torch::zeros({kParams}).requires_grad_(true);
    auto flat = FlatParams::Create({w});
    if (!flat.ok()) return void(out.error = flat.status().ToString());
    torch::optim::SGD inner({w}, torch::optim::SGDOptions(1.0));
    std::unique_ptr<AggregatorClient> client;
    if (rank == 0) {
      auto c = AggregatorClient::Connect(
          MakeClientOptions(shards, "local", "w0", Algo::kLocalSgd, 0, kTau),
          (*flat)->ParamSpan());
      if (!c.ok()) return void(out.error = c.status().ToString());
      client = std::move(*c);
    }
    Co2OptimizerOptions options;
    options.algo = Algo::kLocalSgd;
    options.tau = kTau;
    auto opt = Co2Optimizer::Create(options, flat->get(), &inner,
                                    std::move(client), group->get(), nullptr);
    if (!opt.ok()) return void(out.error = opt.status().ToString());
    EXPECT_EQ((*opt)->is_leader(), rank == 0);
    const torch::Tensor c = torch::full({kParams}, rank + 1.0f);
    for (int step = 0; step < kTau * kRounds; ++step) {
      (*opt)->ZeroGrad();
      (w * c).sum().backward();
      absl::Status s = (*opt)->Step();
      if (!s.ok()) return void(out.error = s.ToString());
      if (step % kTau == kTau - 1) {
        out.after_boundary.push_back((*flat)->params()[0].item<float>());
      }
    }
    absl::Status s = (*opt)->Finish();
    if (!s.ok()) out.error = s.ToString();
  });
  // Mean gradient 1.5 per step; one worker: the average is x itself.
  const std::vector<float> expected = {-4.5f, -9.0f, -13.5f};
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(results[rank].error, "") << "rank " << rank;
    EXPECT_THAT(results[rank].after_boundary,
                ::testing::ElementsAreArray(expected))
        << "rank " << rank;
  }
}

// Only the local leader knows the job's config: on a deterministic co2 job
// it applies updates at the boundary, and a local rank that left apply unset
// takes that choice; one that asked for arrival is refused by name.
TEST(Co2OptimizerTest, LocalRanksTakeTheLeadersApplyMode) {
  constexpr int kRanks = 2;
  for (const std::optional<ApplyAt> rank1 :
       {std::optional<ApplyAt>(), std::optional<ApplyAt>(ApplyAt::kArrival)}) {
    SCOPED_TRACE(rank1 ? "rank 1 asks for arrival" : "rank 1 leaves it unset");
    Shards shards(1);
    TempDir store;
    std::vector<absl::StatusOr<ApplyAt>> chosen(kRanks, absl::UnknownError(""));
    RunThreads(kRanks, [&](int rank) {
      GroupOptions group_options;
      group_options.rank = rank;
      group_options.size = kRanks;
      group_options.store_dir = store.path();
      group_options.prefix = "local";
      group_options.timeout = absl::Seconds(3);  // the refused rank's leader
      auto group = CreateProcessGroup(group_options);
      if (!group.ok()) return void(chosen[rank] = group.status());
      torch::Tensor w = torch::zeros({10}).requires_grad_(true);
      auto flat = FlatParams::Create({w});
      if (!flat.ok()) return void(chosen[rank] = flat.status());
      torch::optim::SGD inner({w}, torch::optim::SGDOptions(1.0));
      std::unique_ptr<AggregatorClient> client;
      if (rank == 0) {
        ClientOptions client_options =
            MakeClientOptions(shards, "apply", "w0", Algo::kCo2, 0, 2);
        client_options.job_config.set_deterministic(true);
        auto c = AggregatorClient::Connect(client_options, (*flat)->ParamSpan());
        if (!c.ok()) return void(chosen[rank] = c.status());
        client = std::move(*c);
      }
      Co2OptimizerOptions options;
      options.tau = 2;
      options.rounds = 2;
      if (rank == 1) options.apply = rank1;
      auto opt = Co2Optimizer::Create(options, flat->get(), &inner,
                                      std::move(client), group->get(), nullptr);
      if (!opt.ok()) return void(chosen[rank] = opt.status());
      chosen[rank] = (*opt)->apply();
    });
    if (!rank1) {
      for (int rank = 0; rank < kRanks; ++rank) {
        CO2_ASSERT_OK(chosen[rank]) << "rank " << rank;
        EXPECT_EQ(*chosen[rank], ApplyAt::kBoundary) << "rank " << rank;
      }
    } else {
      EXPECT_EQ(chosen[1].status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(chosen[1].status().message(),
                  ::testing::HasSubstr("apply=arrival on local rank 1, but the "
                                       "local leader applies at boundary"));
    }
  }
}

// A node of 2 local ranks (gradients 2 and 4: the node's mean 3) leaves a
// co2 job after round 1; worker 0 (gradient 1) goes on alone. α = 1, β = 0,
// equal weights: rounds 0 and 1 move the anchor by −2τ (both counted, the
// leaver's last Δ included), rounds 2..5 by −τ (worker 0 only: the shards
// no longer wait for the node). The node ends on A_3, the anchor its last
// update made.
TEST(Co2OptimizerTest, ALeavingNodeIsCountedUntilItLeaves) {
  constexpr int kTau = 2;
  constexpr int kRounds = 6;
  constexpr int kLeaveAfterRound = 1;
  constexpr int64_t kParams = 5000;
  Shards shards(1);
  TempDir store;
  const std::string job = "leave";
  struct Rank {
    std::string error;
    float final_x = 0;
    bool left = false;
    absl::Status step_after;
  };
  std::vector<Rank> results(3);  // worker 0; the node's ranks 0 and 1
  std::atomic<int> connected{0};
  RunThreads(3, [&](int thread) {
    Rank& out = results[thread];
    const bool node = thread > 0;
    const int local_rank = thread - 1;
    std::unique_ptr<ProcessGroup> group;
    if (node) {
      GroupOptions group_options;
      group_options.rank = local_rank;
      group_options.size = 2;
      group_options.store_dir = store.path();
      group_options.prefix = "node";
      group_options.timeout = absl::Seconds(30);
      auto g = CreateProcessGroup(group_options);
      if (!g.ok()) return void(out.error = g.status().ToString());
      group = std::move(*g);
    }
    torch::Tensor w = torch::zeros({kParams}).requires_grad_(true);
    auto flat = FlatParams::Create({w});
    if (!flat.ok()) return void(out.error = flat.status().ToString());
    torch::optim::SGD inner({w}, torch::optim::SGDOptions(1.0));
    std::unique_ptr<AggregatorClient> client;
    if (!node || local_rank == 0) {
      auto c = AggregatorClient::Connect(
          MakeClientOptions(shards, job, node ? "node" : "w0", Algo::kCo2, 0,
                            kTau),
          (*flat)->ParamSpan());
      if (!c.ok()) return void(out.error = c.status().ToString());
      client = std::move(*c);
      // Both are members before either pushes: round 0 waits for both.
      ++connected;
      if (!co2::testing::WaitFor([&] { return connected == 2; },
                                 absl::Seconds(30))) {
        return void(out.error = "the other worker did not connect");
      }
    }
    Co2OptimizerOptions options;
    options.tau = kTau;
    options.rounds = kRounds;
    options.update_timeout = absl::Seconds(10);  // fail, do not hang
    auto opt = Co2Optimizer::Create(options, flat->get(), &inner,
                                    std::move(client), group.get(), nullptr);
    if (!opt.ok()) return void(out.error = opt.status().ToString());
    const float c = !node ? 1.0f : 2.0f * (local_rank + 1);
    for (int step = 0; step < kTau * kRounds && !(*opt)->left(); ++step) {
      // Asked for during round 1; both ranks learn it at its boundary.
      if (node && step == kLeaveAfterRound * kTau) (*opt)->RequestLeave();
      (*opt)->ZeroGrad();
      (w * c).sum().backward();
      absl::Status s = (*opt)->Step();
      if (!s.ok()) return void(out.error = s.ToString());
    }
    out.left = (*opt)->left();
    if (out.left) {
      (*opt)->ZeroGrad();
      (w * c).sum().backward();
      out.step_after = (*opt)->Step();
      EXPECT_EQ((*opt)->round(), kLeaveAfterRound + 1u);
    }
    absl::Status s = (*opt)->Finish();
    if (!s.ok()) out.error = s.ToString();
    out.final_x = (*flat)->params()[0].item<float>();
    EXPECT_TRUE(AllEqual((*flat)->params(), out.final_x));
  });
  for (int thread = 0; thread < 3; ++thread) {
    EXPECT_EQ(results[thread].error, "") << "thread " << thread;
  }
  EXPECT_FALSE(results[0].left);
  EXPECT_EQ(results[0].final_x, -(2 * 2 * kTau + 4 * kTau));
  for (int thread = 1; thread < 3; ++thread) {
    EXPECT_TRUE(results[thread].left) << "node rank " << thread - 1;
    EXPECT_EQ(results[thread].final_x, -2 * 2 * kTau)
        << "node rank " << thread - 1;
    EXPECT_EQ(results[thread].step_after.code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(results[thread].step_after.message(),
                ::testing::HasSubstr("leaving the job"));
  }
}

// Every worker of a co2 job (AdamW inner steps, eager updates, 2 shards)
// stops at the boundary of round 3, right after saving its WorkerCheckpoint
// (the save fails the boundary, so its Δ_3 is never pushed: a process that
// died there). New optimizers resume from the checkpoints and the inner
// states saved with them; the job ends with the bits of the same job run
// without stopping.
TEST(Co2OptimizerTest, AJobResumedFromWorkerCheckpointsEndsBitIdentical) {
  constexpr int kTau = 3;
  constexpr int kRounds = 7;
  constexpr uint64_t kStopAt = 3;
  constexpr int64_t kParams = 65536 + 1000;  // spans both shards
  Shards shards(2);
  struct Worker {
    torch::Tensor w;
    std::unique_ptr<FlatParams> flat;
    std::unique_ptr<torch::optim::AdamW> inner;
    std::unique_ptr<Co2Optimizer> opt;
  };
  struct Saved {
    WorkerCheckpoint checkpoint;
    std::string inner;  // the inner optimizer's serialized state
  };
  // Runs worker `i` of `job` from round start to the end (or until its
  // boundary of `stop_at` when `saved`), returning its final parameters.
  auto run = [&](const std::string& job, int i, Saved* saved,
                 std::optional<uint64_t> stop_at,
                 std::atomic<int>& connected) -> absl::StatusOr<torch::Tensor> {
    Worker wk;
    wk.w = torch::linspace(-1, 1, kParams).requires_grad_(true);
    CO2_ASSIGN_OR_RETURN(wk.flat, FlatParams::Create({wk.w}));
    wk.inner = std::make_unique<torch::optim::AdamW>(
        std::vector<torch::Tensor>{wk.w}, torch::optim::AdamWOptions(1e-2));
    ClientOptions client_options = MakeClientOptions(
        shards, job, absl::StrCat("w", i), Algo::kCo2, 0, kTau);
    const bool resuming = saved != nullptr && !stop_at;
    if (resuming) {
      client_options.resume_round = saved->checkpoint.round;
      std::copy(saved->checkpoint.anchor.begin(),
                saved->checkpoint.anchor.end(), wk.flat->ParamSpan().begin());
      std::istringstream in(saved->inner);
      torch::serialize::InputArchive archive;
      archive.load_from(in);
      wk.inner->load(archive);
    }
    CO2_ASSIGN_OR_RETURN(
        std::unique_ptr<AggregatorClient> client,
        AggregatorClient::Connect(client_options, wk.flat->ParamSpan()));
    ++connected;
    if (!co2::testing::WaitFor([&] { return connected % 2 == 0; },
                               absl::Seconds(30))) {
      return absl::DeadlineExceededError("the other worker did not connect");
    }
    Co2OptimizerOptions options;
    options.tau = kTau;
    options.rounds = kRounds;
    options.eager_share = 0.5;
    // Bit-identical needs the update applied at the same step in both runs.
    options.apply = ApplyAt::kBoundary;
    options.update_timeout = absl::Seconds(10);  // fail, do not hang
    if (stop_at) {
      options.checkpoint_every = 1;
      options.save_checkpoint = [&](const WorkerCheckpoint& c) {
        if (c.round != *stop_at) return absl::OkStatus();
        saved->checkpoint = c;
        std::ostringstream out;
        torch::serialize::OutputArchive archive;
        wk.inner->save(archive);
        archive.save_to(out);
        saved->inner = out.str();
        return absl::CancelledError("stopped after the checkpoint");
      };
    }
    if (resuming) options.resume = &saved->checkpoint;
    CO2_ASSIGN_OR_RETURN(
        wk.opt, Co2Optimizer::Create(options, wk.flat.get(), wk.inner.get(),
                                     std::move(client), nullptr, nullptr));
    const float c = 0.5f + i;
    for (int64_t step = wk.opt->round() * kTau; step < kTau * kRounds;
         ++step) {
      wk.opt->ZeroGrad();
      ((wk.w * c).sum() + 0.5 * wk.w.pow(2).sum()).backward();
      absl::Status status = wk.opt->Step();
      if (status.code() == absl::StatusCode::kCancelled && stop_at) {
        return torch::Tensor();
      }
      CO2_RETURN_IF_ERROR(status);
    }
    CO2_RETURN_IF_ERROR(wk.opt->Finish());
    return wk.flat->params().clone();
  };
  std::vector<torch::Tensor> whole(2), resumed(2);
  std::vector<Saved> saved(2);
  std::vector<std::string> errors(2);
  std::atomic<int> connected{0};
  auto in_threads = [&](const std::function<absl::StatusOr<torch::Tensor>(
                            int)>& body,
                        std::vector<torch::Tensor>* out) {
    RunThreads(2, [&](int i) {
      absl::StatusOr<torch::Tensor> x = body(i);
      if (!x.ok()) {
        errors[i] = x.status().ToString();
      } else if (out != nullptr) {
        (*out)[i] = *x;
      }
    });
  };
  in_threads([&](int i) { return run("whole", i, nullptr, {}, connected); },
             &whole);
  in_threads(
      [&](int i) { return run("resumed", i, &saved[i], kStopAt, connected); },
      nullptr);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(errors[i], "") << "worker " << i;
    ASSERT_EQ(saved[i].checkpoint.round, kStopAt) << "worker " << i;
    EXPECT_EQ(saved[i].checkpoint.steps, kStopAt * kTau + kTau);
    EXPECT_FALSE(saved[i].checkpoint.start_offset.empty());
  }
  in_threads(
      [&](int i) { return run("resumed", i, &saved[i], {}, connected); },
      &resumed);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(errors[i], "") << "worker " << i;
    EXPECT_TRUE(torch::equal(resumed[i], whole[i])) << "worker " << i;
  }
  EXPECT_TRUE(torch::equal(whole[0], whole[1]));
}

TEST(Co2OptimizerTest, DdpAllReducesGradientsAcrossAllRanks) {
  constexpr int kRanks = 3;
  constexpr int64_t kParams = 1000;
  TempDir store;
  std::vector<RankResult> results(kRanks);
  RunThreads(kRanks, [&](int rank) {
    RankResult& out = results[rank];
    GroupOptions group_options;
    group_options.rank = rank;
    group_options.size = kRanks;
    group_options.store_dir = store.path();
    group_options.prefix = "global";
    group_options.timeout = absl::Seconds(30);
    auto group = CreateProcessGroup(group_options);
    if (!group.ok()) return void(out.error = group.status().ToString());
    // Different initial values: Create makes rank 0's the common start.
    torch::Tensor w = torch::full({kParams}, 10.0f * rank).requires_grad_(true);
    auto flat = FlatParams::Create({w});
    if (!flat.ok()) return void(out.error = flat.status().ToString());
    torch::optim::SGD inner({w}, torch::optim::SGDOptions(1.0));
    Co2OptimizerOptions options;
    options.algo = Algo::kDdp;
    options.tau = 2;
    auto opt = Co2Optimizer::Create(options, flat->get(), &inner, nullptr,
                                    nullptr, group->get());
    if (!opt.ok()) return void(out.error = opt.status().ToString());
    const torch::Tensor c = torch::full({kParams}, rank + 1.0f);
    for (int step = 0; step < 4; ++step) {
      (*opt)->ZeroGrad();
      (w * c).sum().backward();
      absl::Status s = (*opt)->Step();
      if (!s.ok()) return void(out.error = s.ToString());
      if (!AllEqual((*flat)->params(), (*flat)->params()[0].item<float>())) {
        return void(out.error = "parameters differ within a rank");
      }
      out.after_boundary.push_back((*flat)->params()[0].item<float>());
    }
    if ((*opt)->rounds().size() != 2) out.error = "expected 2 stats rounds";
    if ((*opt)->bytes_sent() != 4 * kParams * sizeof(float)) {
      out.error = absl::StrCat("bytes_sent ", (*opt)->bytes_sent());
    }
  });
  const std::vector<float> expected = {-2.0f, -4.0f, -6.0f, -8.0f};
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(results[rank].error, "") << "rank " << rank;
    EXPECT_THAT(results[rank].after_boundary,
                ::testing::ElementsAreArray(expected));
  }
}

// ---------------------------------------------------------------------------
// A worker that joins a running job (a restarted one) fetches A_s and owes
// the update of round s − 1, also when s − 1 is the job's last round and it
// computes no round itself: whatever moment it joins at, it ends with the
// closed-form final anchor, the same bits as the worker that never stopped,
// and Finish's check against the shards passes. Both workers have c = 1, so
// every round's mean is τ whoever takes part, and one thread interleaves
// their inner steps (the one in the lower round goes first), so the moment
// is exact: worker 1 joins after `join_after_steps` steps of worker 0, once
// the shards closed every round worker 0 finished.

struct JoinCase {
  const char* name;
  int join_after_steps;  // of worker 0; -1: after worker 0 finished and left
  uint64_t start_round;  // the round worker 1 starts at
};

void PrintTo(const JoinCase& c, std::ostream* os) { *os << c.name; }

class JoinMomentTest : public ::testing::TestWithParam<JoinCase> {};

constexpr int kJoinTau = 2;
constexpr int kJoinRounds = 6;  // rounds 0..5

TEST_P(JoinMomentTest, TheJoiningWorkerEndsOnTheFinalAnchor) {
  const JoinCase param = GetParam();
  constexpr int64_t kParams = 65536 + 1000;  // spans both shards
  constexpr int kSteps = kJoinTau * kJoinRounds;
  constexpr float kBeta = 0.5f;
  Shards shards(2);
  ASSERT_EQ(shards.addresses().size(), 2u);
  const std::string job = absl::StrCat("join-", param.name);
  const float expected =
      ExpectedAnchors(Algo::kCo2, kBeta, kJoinTau, kJoinRounds).back();

  struct Worker {
    torch::Tensor w;
    std::unique_ptr<FlatParams> flat;
    std::unique_ptr<torch::optim::SGD> inner;
    std::unique_ptr<Co2Optimizer> opt;
    int steps = 0;  // inner steps taken, counted from round 0
  };
  auto connect = [&](int i, Worker& worker) -> absl::Status {
    worker.w = torch::zeros({kParams}).requires_grad_(true);
    CO2_ASSIGN_OR_RETURN(worker.flat, FlatParams::Create({worker.w}));
    worker.inner = std::make_unique<torch::optim::SGD>(
        std::vector<torch::Tensor>{worker.w}, torch::optim::SGDOptions(1.0));
    CO2_ASSIGN_OR_RETURN(
        std::unique_ptr<AggregatorClient> client,
        AggregatorClient::Connect(
            MakeClientOptions(shards, job, absl::StrCat("w", i), Algo::kCo2,
                              kBeta, kJoinTau),
            worker.flat->ParamSpan()));
    Co2OptimizerOptions options;
    options.tau = kJoinTau;
    options.rounds = kJoinRounds;
    options.update_timeout = absl::Seconds(10);  // fail, do not hang
    CO2_ASSIGN_OR_RETURN(
        worker.opt,
        Co2Optimizer::Create(options, worker.flat.get(), worker.inner.get(),
                             std::move(client), nullptr, nullptr));
    worker.steps = static_cast<int>(worker.opt->round()) * kJoinTau;
    return absl::OkStatus();
  };
  auto step = [&](Worker& worker) -> absl::Status {
    worker.opt->ZeroGrad();
    worker.w.sum().backward();
    ++worker.steps;
    return worker.opt->Step();
  };
  // The anchor round of shard `i` once every round worker 0 finished closed.
  auto closed_through = [&](int rounds_done) {
    const uint64_t want = rounds_done == 0 ? 0 : rounds_done + 1;
    return co2::testing::WaitFor(
        [&] {
          for (int i = 0; i < 2; ++i) {
            if (shards.AnchorRound(i, job) != want) return false;
          }
          return true;
        },
        absl::Seconds(10));
  };

  Worker w0, w1;
  CO2_ASSERT_OK(connect(0, w0));
  const int join_after =
      param.join_after_steps < 0 ? kSteps : param.join_after_steps;
  while (w0.steps < join_after) CO2_ASSERT_OK(step(w0));
  if (param.join_after_steps < 0) {
    CO2_ASSERT_OK(w0.opt->Finish());
    ASSERT_TRUE(closed_through(kJoinRounds));
  } else {
    ASSERT_TRUE(closed_through(w0.steps / kJoinTau));
  }
  const absl::Status joined = connect(1, w1);
  CO2_ASSERT_OK(joined);
  EXPECT_EQ(w1.opt->round(), param.start_round);
  // Never block: the worker in the lower round steps first.
  while (w0.steps < kSteps || w1.steps < kSteps) {
    Worker& next =
        w1.steps >= kSteps || (w0.steps < kSteps &&
                               w0.steps / kJoinTau <= w1.steps / kJoinTau)
            ? w0
            : w1;
    const absl::Status s = step(next);
    CO2_ASSERT_OK(s);
  }
  if (param.join_after_steps >= 0) {
    const absl::Status s = w0.opt->Finish();
    CO2_ASSERT_OK(s);
  }
  const absl::Status finished = w1.opt->Finish();
  CO2_ASSERT_OK(finished);
  EXPECT_TRUE(AllEqual(w1.flat->params(), expected));
  EXPECT_TRUE(AllEqual(w0.flat->params(), expected));
  EXPECT_EQ(w1.opt->ParamsHash(), w0.opt->ParamsHash());
  EXPECT_EQ(w1.opt->anchor_round(), kJoinRounds + 1u);
  EXPECT_EQ(w0.opt->anchor_round(), kJoinRounds + 1u);
}

INSTANTIATE_TEST_SUITE_P(
    Moments, JoinMomentTest,
    ::testing::Values(
        JoinCase{"first_round", 1, 0},
        JoinCase{"middle_round", 3 * kJoinTau + 1, 4},
        JoinCase{"round_before_the_last", (kJoinRounds - 2) * kJoinTau + 1,
                 kJoinRounds - 1},
        JoinCase{"last_round", (kJoinRounds - 1) * kJoinTau + 1, kJoinRounds},
        JoinCase{"during_finish", kJoinRounds* kJoinTau, kJoinRounds + 1},
        JoinCase{"after_the_others_left", -1, kJoinRounds + 1}),
    [](const ::testing::TestParamInfo<JoinCase>& info) {
      return std::string(info.param.name);
    });

// VerifyAnchor tells a worker whose anchor is not the shards' which element
// and which hashes differ, and an anchor of another round apart from one
// with other bits.
TEST(Co2OptimizerTest, VerifyAnchorNamesTheDifference) {
  constexpr int64_t kParams = 65536 + 1000;
  Shards shards(2);
  ASSERT_EQ(shards.addresses().size(), 2u);
  std::vector<float> anchor(kParams, 0.25f);
  auto client = AggregatorClient::Connect(
      MakeClientOptions(shards, "verify", "w0", Algo::kCo2, 0, 2),
      absl::MakeSpan(anchor));
  CO2_ASSERT_OK(client);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  CO2_EXPECT_OK((*client)->VerifyAnchor(anchor, 0, deadline));

  const absl::Status round = (*client)->VerifyAnchor(anchor, 3, deadline);
  EXPECT_EQ(round.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(round.message(),
              ::testing::HasSubstr("anchor of round 0, this worker that of "
                                   "round 3 with the same bits"));

  anchor[65536 + 7] = std::nextafter(0.25f, 1.0f);
  const absl::Status bits = (*client)->VerifyAnchor(anchor, 0, deadline);
  EXPECT_EQ(bits.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bits.message(), ::testing::HasSubstr("shard 1"));
  EXPECT_THAT(bits.message(),
              ::testing::HasSubstr("first different at element 65543"));
  EXPECT_THAT(bits.message(), ::testing::HasSubstr("FNV-1a of the range"));
}

// With carried progress (asked for, or co2's default) a worker's parameters
// are its own offset from the anchor; EvaluateAtAnchor shows the evaluation
// the anchor and gives the worker its parameters back.
class EvaluateAtAnchorTest
    : public ::testing::TestWithParam<std::optional<bool>> {};

INSTANTIATE_TEST_SUITE_P(CarryAskedOrDefault, EvaluateAtAnchorTest,
                         ::testing::Values(std::optional<bool>(true),
                                           std::optional<bool>()));

TEST_P(EvaluateAtAnchorTest, SeesTheAnchorAndRestoresTheParameters) {
  Shards shards(1);
  torch::Tensor w = torch::zeros({8}).requires_grad_(true);
  auto flat = FlatParams::Create({w});
  CO2_ASSERT_OK(flat);
  torch::optim::SGD inner({w}, torch::optim::SGDOptions(0.1));
  auto opt = LoneCo2Worker(shards, "evaluate", flat->get(), &inner, GetParam());
  CO2_ASSERT_OK(opt);
  ASSERT_TRUE((*opt)->carry_progress());
  for (int step = 0; step < 2; ++step) {
    (*opt)->ZeroGrad();
    w.sum().backward();
    CO2_ASSERT_OK((*opt)->Step());
  }
  // Round 0 owes no update: the anchor is still A_0 = 0, and x is where
  // this worker's own round ended, two SGD steps down every gradient of 1.
  const torch::Tensor x = w.detach().clone();
  ASSERT_TRUE(torch::allclose(x, torch::full({8}, -0.2f)));
  torch::Tensor seen;
  CO2_ASSERT_OK((*opt)->EvaluateAtAnchor([&] {
    seen = w.detach().clone();
    return absl::OkStatus();
  }));
  EXPECT_TRUE(torch::equal(seen, torch::zeros({8})));
  EXPECT_TRUE(torch::equal(w.detach(), x));
  const absl::Status failed = (*opt)->EvaluateAtAnchor(
      [] { return absl::InternalError("evaluation failed"); });
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(torch::equal(w.detach(), x));
}

// ---------------------------------------------------------------------------
// Memory and validation.

TEST(Co2OptimizerTest, LeaderHoldsOnlyParamsGradsAnchorStateAndClientBuffers) {
  Shards shards(1);
  constexpr int64_t kParams = 100000;
  torch::Tensor w = torch::zeros({kParams}).requires_grad_(true);
  auto flat = FlatParams::Create({w});
  CO2_ASSERT_OK(flat);
  torch::optim::AdamW inner({w}, torch::optim::AdamWOptions(1e-3));
  auto opt = LoneCo2Worker(shards, "memory", flat->get(), &inner,
                           /*carry_progress=*/false);
  CO2_ASSERT_OK(opt);
  for (int step = 0; step < 4; ++step) {
    (*opt)->ZeroGrad();
    w.sum().backward();
    CO2_ASSERT_OK((*opt)->Step());
  }
  const MemoryReport m = (*opt)->Memory();
  const size_t model = kParams * sizeof(float);
  EXPECT_EQ(m.params, model);
  EXPECT_EQ(m.grads, model);
  EXPECT_EQ(m.anchor, model);
  EXPECT_EQ(m.staging, 0u);
  EXPECT_EQ(m.optimizer_state, 2 * model);  // AdamW: exp_avg, exp_avg_sq
  EXPECT_EQ(m.client_buffers, 2 * model);   // fp32 send + receive
  // Nothing else of model size: 7 model-sized buffers in all.
  EXPECT_EQ(m.Total(), 7 * model);
  EXPECT_EQ((*opt)->bytes_sent(), 2 * model);  // two rounds pushed
  CO2_ASSERT_OK((*opt)->Finish());
  EXPECT_EQ((*opt)->Step().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Co2OptimizerTest, RejectsInconsistentSetups) {
  torch::Tensor w = torch::zeros({10}).requires_grad_(true);
  auto flat = FlatParams::Create({w});
  CO2_ASSERT_OK(flat);
  torch::optim::SGD inner({w}, torch::optim::SGDOptions(0.1));
  Co2OptimizerOptions options;
  options.tau = 0;
  EXPECT_EQ(Co2Optimizer::Create(options, flat->get(), &inner, nullptr,
                                 nullptr, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  options.tau = 2;
  options.algo = Algo::kCo2;  // without the job's rounds
  auto no_rounds = Co2Optimizer::Create(options, flat->get(), &inner, nullptr,
                                        nullptr, nullptr);
  EXPECT_EQ(no_rounds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_rounds.status().message(), ::testing::HasSubstr("rounds"));
  options.rounds = 4;
  options.apply = ApplyAt::kArrival;
  options.apply_by_step = 2;  // not inside a round of 2 steps
  auto by_boundary = Co2Optimizer::Create(options, flat->get(), &inner,
                                          nullptr, nullptr, nullptr);
  EXPECT_EQ(by_boundary.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(by_boundary.status().message(),
              ::testing::HasSubstr("apply_by_step is 2: must be between 1"));
  options.apply = ApplyAt::kBoundary;
  options.apply_by_step = 0;  // a leader without a client
  auto no_client = Co2Optimizer::Create(options, flat->get(), &inner, nullptr,
                                        nullptr, nullptr);
  EXPECT_EQ(no_client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_client.status().message(),
              ::testing::HasSubstr("aggregator client"));

  // A co2 optimizer on a job that runs with staleness 0.
  Shards shards(1);
  auto client = AggregatorClient::Connect(
      MakeClientOptions(shards, "mismatch", "w0", Algo::kLocalSgd, 0, 2),
      (*flat)->ParamSpan());
  CO2_ASSERT_OK(client);
  auto mismatch = Co2Optimizer::Create(options, flat->get(), &inner,
                                       std::move(*client), nullptr, nullptr);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.status().message(),
              ::testing::HasSubstr("max_staleness"));

  EXPECT_EQ(ParseAlgo("slowmo").value(), Algo::kSlowMo);
  EXPECT_EQ(ParseAlgo("sgd").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Co2OptimizerOptions left unset runs the algorithm co2-train and
// co2.Optimizer run by default (docs/defaults.md): co2 applies the
// owed update on arrival and carries its progress until then; a
// deterministic job applies at the boundary; the synchronous algorithms
// carry nothing.
TEST(Co2OptimizerTest, UnsetChoicesAreCo2TrainsDefaults) {
  struct Case {
    Algo algo;
    bool deterministic;
    ApplyAt apply;
    bool carry_progress;
  };
  const Case cases[] = {{Algo::kCo2, false, ApplyAt::kArrival, true},
                        {Algo::kCo2, true, ApplyAt::kBoundary, true},
                        {Algo::kLocalSgd, false, ApplyAt::kBoundary, false}};
  Shards shards(1);
  int job = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(AlgoName(c.algo), " deterministic=",
                              c.deterministic));
    EXPECT_EQ(c.apply, DefaultApplyAt(c.algo, c.deterministic));
    EXPECT_EQ(c.carry_progress, DefaultCarryProgress(c.algo, false));
    torch::Tensor w = torch::zeros({10}).requires_grad_(true);
    auto flat = FlatParams::Create({w});
    CO2_ASSERT_OK(flat);
    torch::optim::SGD inner({w}, torch::optim::SGDOptions(0.1));
    ClientOptions client_options = MakeClientOptions(
        shards, absl::StrCat("defaults", job++), "w0", c.algo, 0, 2);
    client_options.job_config.set_deterministic(c.deterministic);
    auto client =
        AggregatorClient::Connect(client_options, (*flat)->ParamSpan());
    CO2_ASSERT_OK(client);
    Co2OptimizerOptions options;
    options.algo = c.algo;
    options.tau = 2;
    options.rounds = 2;
    auto opt = Co2Optimizer::Create(options, flat->get(), &inner,
                                    std::move(*client), nullptr, nullptr);
    CO2_ASSERT_OK(opt);
    EXPECT_EQ((*opt)->apply(), c.apply);
    EXPECT_EQ((*opt)->carry_progress(), c.carry_progress);
  }
}

}  // namespace
}  // namespace co2::client
