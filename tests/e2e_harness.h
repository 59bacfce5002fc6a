// Shared pieces of the end-to-end tests: shard servers in this process,
// worker threads that follow the CO2 boundary protocol with exact
// pseudo-gradients, and the reference anchor trajectory they must produce.
#ifndef CO2_TESTS_E2E_HARNESS_H_
#define CO2_TESTS_E2E_HARNESS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/aggregator_client.h"
#include "client/anchor_exchange.h"
#include "co2/v1/aggregator.pb.h"
#include "common/codec.h"
#include "server/job/shard_observer.h"
#include "server/service/aggregator_server.h"

namespace co2::testing {

struct E2eSpec {
  size_t params = (1 << 20) + 12345;  // > 1M, last shard ragged
  uint32_t shards = 2;
  int workers = 4;
  uint64_t rounds = 20;
};

// Worker i's pseudo-gradient of round r: small multiples of 2^-10, so every
// weighted sum on a shard is exact and the mean does not depend on the order
// in which chunks arrive.
float Delta(int worker, uint64_t round, size_t j);
double Weight(int worker);
float Initial(size_t j);

// CO2 with momentum, gap-aware penalty and adaptive clipping; every worker
// required (min_workers = spec.workers).
v1::JobConfig Co2Config(const E2eSpec& spec, v1::Codec downlink);

// S shard servers on 127.0.0.1 ports chosen by the kernel.
class Cluster {
 public:
  // `checkpoint_dir` empty: no checkpoints. `observer` (may be null,
  // borrowed) is every shard's ShardObserver.
  Cluster(uint32_t num_shards, std::string checkpoint_dir = "",
          server::ShardObserver* observer = nullptr);
  const std::vector<std::string>& addresses() const { return addresses_; }
  // Stops shard i at once (open streams break) and starts it again on the
  // same port from its checkpoint directory; `while_stopped` (may be empty)
  // runs in between with that directory (e.g. to remove or damage files).
  absl::Status Restart(
      uint32_t i,
      const std::function<void(const std::string&)>& while_stopped = {});
  server::JobRegistry* registry(uint32_t i) { return shards_[i]->registry(); }
  // The full anchor assembled from the shards, and its round.
  std::vector<float> Anchor(const std::string& job, uint64_t* round);

 private:
  absl::Status StartShard(uint32_t i, const std::string& address);
  uint32_t num_shards_;
  std::string checkpoint_dir_;
  server::ShardObserver* observer_;
  std::vector<std::unique_ptr<server::AggregatorServer>> shards_;
  std::vector<std::string> addresses_;
};

// What the shards must compute, on the whole vector at once.
std::vector<float> ReferenceAnchor(const E2eSpec& spec,
                                   const v1::JobConfig& config);

struct WorkerResult {
  absl::Status status;
  std::vector<float> anchor;
  uint64_t reconnects = 0;
};

// Blocks the N workers' threads until all arrived; the last one to arrive
// runs `action` first. Waits at most `timeout` (false then).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  bool ArriveAndWait(const std::function<void()>& action,
                     absl::Duration timeout);

 private:
  absl::Mutex mu_;
  const int n_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// Worker `worker`'s client options for `job` on the shards at `addresses`,
// as RunWorker connects it.
client::ClientOptions WorkerOptions(const std::vector<std::string>& addresses,
                                    const std::string& job,
                                    const v1::JobConfig& config, int worker);
// The parameters every worker starts from: Initial(j) for j < params.
std::vector<float> InitialAnchor(size_t params);

// Connects with `x` (its anchor on return), then waits at `joined` until
// every worker has connected (within `timeout`): all of them take part in
// round 0. DEADLINE_EXCEEDED when the others did not come.
absl::StatusOr<std::unique_ptr<client::AggregatorClient>> ConnectWithEveryone(
    const client::ClientOptions& options, absl::Span<float> x, Barrier& joined,
    absl::Duration timeout);

// AnchorExchange options for worker `worker` of spec: its rounds, its
// Weight, `timeout` for every wait.
client::AnchorExchangeOptions ExchangeOptions(const E2eSpec& spec, int worker,
                                              absl::Duration timeout);

// One worker following the CO2 boundary protocol for spec.rounds rounds and
// draining the last update; `after_round` (may be empty) runs after each of
// its boundaries. With `joined`, the worker waits there after connecting
// until every worker has connected, so that all of them take part in round 0
// (a worker whose thread starts late would otherwise join a running job).
WorkerResult RunWorker(const E2eSpec& spec,
                       const std::vector<std::string>& addresses,
                       const std::string& job, const v1::JobConfig& config,
                       common::Codec uplink, int worker,
                       const std::function<void(uint64_t)>& after_round = {},
                       Barrier* joined = nullptr);

// Runs spec.workers workers whose `local_ranks` ranks (threads) each
// exchange their own slice (ClientOptions::owned_shards from
// common::OwnedShards); a worker's result holds its ranks' slices joined, and
// the first rank's error.
std::vector<WorkerResult> RunSlicedWorkers(
    const E2eSpec& spec, const std::vector<std::string>& addresses,
    const std::string& job, const v1::JobConfig& config,
    common::Codec uplink, uint32_t local_ranks);

// Runs spec.workers workers in threads; uplink codec per worker.
std::vector<WorkerResult> RunWorkers(
    const E2eSpec& spec, const std::vector<std::string>& addresses,
    const std::string& job, const v1::JobConfig& config,
    const std::function<common::Codec(int)>& uplink,
    const std::function<void(int, uint64_t)>& after_round = {});

}  // namespace co2::testing

#endif  // CO2_TESTS_E2E_HARNESS_H_
