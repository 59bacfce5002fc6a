#include "tests/e2e_harness.h"

#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/aggregator_client.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "server/job/outer_optimizer.h"

namespace co2::testing {

float Delta(int worker, uint64_t round, size_t j) {
  const int v = static_cast<int>((j * 7 + worker * 13 + round * 5) % 17) - 8;
  return static_cast<float>(v) / 1024.0f;
}
double Weight(int worker) { return worker + 1; }
float Initial(size_t j) { return static_cast<float>(j % 101) / 64.0f; }

v1::JobConfig Co2Config(const E2eSpec& spec, v1::Codec downlink) {
  v1::JobConfig config = common::DefaultJobConfig(spec.params, spec.shards);
  config.set_alpha(0.8f);
  config.set_beta(0.5f);
  config.set_gap_penalty(v1::GAP_PENALTY_GAP_AWARE);
  config.set_clip(v1::CLIP_ADAPTIVE);
  config.set_clip_value(2.0f);
  config.set_downlink_codec(downlink);
  config.set_min_workers(spec.workers);
  config.set_round_timeout_ms(60000);
  return config;
}

Cluster::Cluster(uint32_t num_shards, std::string checkpoint_dir,
                 server::ShardObserver* observer)
    : num_shards_(num_shards),
      checkpoint_dir_(std::move(checkpoint_dir)),
      observer_(observer),
      shards_(num_shards),
      addresses_(num_shards) {
  for (uint32_t i = 0; i < num_shards; ++i) {
    absl::Status s = StartShard(i, "127.0.0.1:0");
    if (!s.ok()) std::abort();
  }
}

absl::Status Cluster::StartShard(uint32_t i, const std::string& address) {
  server::AggregatorServerOptions options;
  options.address = address;
  options.registry.shard_index = i;
  options.registry.num_shards = num_shards_;
  options.registry.checkpoint_dir = checkpoint_dir_;
  options.registry.shard.observer = observer_;
  auto started = server::AggregatorServer::Start(options);
  if (!started.ok()) return started.status();
  addresses_[i] = absl::StrCat("127.0.0.1:", (*started)->port());
  shards_[i] = *std::move(started);
  return absl::OkStatus();
}

absl::Status Cluster::Restart(
    uint32_t i, const std::function<void(const std::string&)>& while_stopped) {
  shards_[i]->Shutdown(absl::ZeroDuration());
  shards_[i].reset();
  if (while_stopped) while_stopped(checkpoint_dir_);
  return StartShard(i, addresses_[i]);
}

absl::StatusOr<std::unique_ptr<client::AggregatorClient>> ConnectWithEveryone(
    const client::ClientOptions& options, absl::Span<float> x, Barrier& joined,
    absl::Duration timeout) {
  auto connected = client::AggregatorClient::Connect(options, x);
  const bool all = joined.ArriveAndWait([] {}, timeout);
  if (!connected.ok()) return connected.status();
  if (!all) return absl::DeadlineExceededError("the other workers did not join");
  return connected;
}

client::AnchorExchangeOptions ExchangeOptions(const E2eSpec& spec, int worker,
                                              absl::Duration timeout) {
  client::AnchorExchangeOptions eo;
  eo.rounds = spec.rounds;
  eo.samples_per_step = Weight(worker);
  eo.update_timeout = timeout;
  eo.push_timeout = timeout;
  return eo;
}

bool Barrier::ArriveAndWait(const std::function<void()>& action,
                            absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (++arrived_ == n_) {
    action();
    released_ = true;
    return true;
  }
  return mu_.AwaitWithTimeout(absl::Condition(&released_), timeout);
}

std::vector<float> Cluster::Anchor(const std::string& job, uint64_t* round) {
  std::vector<float> anchor;
  for (auto& shard : shards_) {
    auto js = shard->registry()->Find(job);
    if (!js.ok()) return {};
    std::vector<float> part = (*js)->AnchorForTesting(round);
    anchor.insert(anchor.end(), part.begin(), part.end());
  }
  return anchor;
}

std::vector<float> ReferenceAnchor(const E2eSpec& spec,
                                   const v1::JobConfig& config) {
  server::OuterConfig outer;
  outer.alpha = config.alpha();
  outer.beta = config.beta();
  outer.penalty = server::GapPenalty::kGapAware;
  outer.clip = server::ClipMode::kAdaptive;
  outer.clip_value = config.clip_value();
  const common::Codec codec = common::Codec(config.downlink_codec());
  const size_t n = spec.params;
  std::vector<float> anchor = InitialAnchor(n);
  std::vector<float> gap(n, 0.0f), m(n, 0.0f), mean(n), update(n);
  double total_weight = 0;
  for (int w = 0; w < spec.workers; ++w) total_weight += Weight(w);
  for (uint64_t r = 0; r < spec.rounds; ++r) {
    for (size_t j = 0; j < n; ++j) {
      float sum = 0;
      for (int w = 0; w < spec.workers; ++w) {
        sum += static_cast<float>(Weight(w)) * Delta(w, r, j);
      }
      mean[j] = static_cast<float>(sum / total_weight);
    }
    server::OuterStep(outer, r, mean, gap, absl::MakeSpan(m),
                      absl::MakeSpan(update));
    // Encoded chunk by chunk within each shard, as the shards do.
    for (uint32_t s = 0; s < spec.shards; ++s) {
      const common::Range range = *common::ShardRangeFor(n, spec.shards, s);
      for (size_t c = 0; c < common::NumChunks(range.size()); ++c) {
        const common::Range chunk = common::ChunkRange(range.size(), c);
        auto u = absl::MakeSpan(update).subspan(range.begin + chunk.begin,
                                                chunk.size());
        std::string bytes(common::EncodedSize(codec, u.size()), '\0');
        common::Encode(codec, u, absl::MakeSpan(bytes.data(), bytes.size()));
        common::Decode(codec, bytes, u);
      }
    }
    for (size_t j = 0; j < n; ++j) {
      anchor[j] += update[j];
      gap[j] = update[j];
    }
  }
  return anchor;
}

client::ClientOptions WorkerOptions(const std::vector<std::string>& addresses,
                                    const std::string& job,
                                    const v1::JobConfig& config, int worker) {
  client::ClientOptions options;
  options.addresses = addresses;
  options.job = job;
  options.worker_id = absl::StrCat("worker-", worker);
  options.job_config = config;
  return options;
}

std::vector<float> InitialAnchor(size_t params) {
  std::vector<float> anchor(params);
  for (size_t j = 0; j < params; ++j) anchor[j] = Initial(j);
  return anchor;
}

namespace {

// RunWorker's protocol over the shards `owned` (all when unset), with the
// slice of the anchor they serve.
WorkerResult RunSlice(const E2eSpec& spec,
                      const std::vector<std::string>& addresses,
                      const std::string& job, const v1::JobConfig& config,
                      common::Codec uplink, int worker,
                      std::optional<common::Range> owned,
                      const std::function<void(uint64_t)>& after_round,
                      Barrier* joined) {
  WorkerResult result;
  auto fail = [&](absl::Status s) {
    result.status = std::move(s);
    return result;
  };
  common::Range slice{0, spec.params};
  if (owned.has_value()) {
    slice = {common::ShardRangeFor(spec.params, addresses.size(), owned->begin)
                 ->begin,
             common::ShardRangeFor(spec.params, addresses.size(),
                                   owned->end - 1)
                 ->end};
  }
  const std::vector<float> initial = InitialAnchor(spec.params);
  std::vector<float> anchor(initial.begin() + slice.begin,
                            initial.begin() + slice.end);
  client::ClientOptions options = WorkerOptions(addresses, job, config, worker);
  options.uplink_codec = uplink;
  options.owned_shards = owned;
  options.num_parameters = spec.params;
  auto connected =
      client::AggregatorClient::Connect(options, absl::MakeSpan(anchor));
  // Arrives even when Connect failed, so the others do not wait for it.
  const bool all_joined =
      joined == nullptr || joined->ArriveAndWait([] {}, absl::Seconds(60));
  if (!connected.ok()) return fail(connected.status());
  if (!all_joined) {
    return fail(absl::DeadlineExceededError(
        "the other workers did not connect within 60 s"));
  }
  client::AggregatorClient& c = **connected;
  if (auto s = c.TrackAnchor(anchor); !s.ok()) return fail(s);
  if (c.start_round() != 0) {
    return fail(absl::InternalError("a fresh job must start at round 0"));
  }
  std::vector<float> delta(slice.size());
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  for (uint64_t r = 0; r < spec.rounds; ++r) {
    for (size_t j = 0; j < delta.size(); ++j) {
      delta[j] = Delta(worker, r, slice.begin + j);
    }
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
    if (after_round) after_round(r);
  }
  const uint64_t last = spec.rounds - 1;
  if (auto s = c.WaitForUpdate(last, deadline); !s.ok()) return fail(s);
  if (auto a = c.ApplyUpdate(last, absl::MakeSpan(anchor)); !a.ok()) {
    return fail(a.status());
  }
  const client::ClientStats stats = c.stats();
  if (stats.rounds_pushed != spec.rounds ||
      stats.updates_received != spec.rounds) {
    return fail(absl::InternalError(absl::StrCat(
        "pushed ", stats.rounds_pushed, " received ", stats.updates_received)));
  }
  result.reconnects = stats.reconnects;
  if (auto s = c.Leave(absl::Now() + absl::Seconds(10)); !s.ok()) return fail(s);
  result.anchor = std::move(anchor);
  return result;
}

}  // namespace

WorkerResult RunWorker(const E2eSpec& spec,
                       const std::vector<std::string>& addresses,
                       const std::string& job, const v1::JobConfig& config,
                       common::Codec uplink, int worker,
                       const std::function<void(uint64_t)>& after_round,
                       Barrier* joined) {
  return RunSlice(spec, addresses, job, config, uplink, worker, std::nullopt,
                  after_round, joined);
}

std::vector<WorkerResult> RunSlicedWorkers(
    const E2eSpec& spec, const std::vector<std::string>& addresses,
    const std::string& job, const v1::JobConfig& config,
    common::Codec uplink, uint32_t local_ranks) {
  std::vector<std::vector<WorkerResult>> ranks(
      spec.workers, std::vector<WorkerResult>(local_ranks));
  Barrier joined(spec.workers * static_cast<int>(local_ranks));
  std::vector<std::thread> threads;
  for (int w = 0; w < spec.workers; ++w) {
    for (uint32_t k = 0; k < local_ranks; ++k) {
      threads.emplace_back([&, w, k] {
        absl::StatusOr<common::Range> owned =
            common::OwnedShards(addresses.size(), local_ranks, k);
        if (!owned.ok()) {
          ranks[w][k].status = owned.status();
          joined.ArriveAndWait([] {}, absl::Seconds(60));
          return;
        }
        ranks[w][k] = RunSlice(spec, addresses, job, config, uplink, w,
                               *owned, {}, &joined);
      });
    }
  }
  for (auto& t : threads) t.join();
  std::vector<WorkerResult> results(spec.workers);
  for (int w = 0; w < spec.workers; ++w) {
    for (WorkerResult& rank : ranks[w]) {
      if (results[w].status.ok()) results[w].status = rank.status;
      results[w].anchor.insert(results[w].anchor.end(), rank.anchor.begin(),
                               rank.anchor.end());
      results[w].reconnects += rank.reconnects;
    }
  }
  return results;
}

std::vector<WorkerResult> RunWorkers(
    const E2eSpec& spec, const std::vector<std::string>& addresses,
    const std::string& job, const v1::JobConfig& config,
    const std::function<common::Codec(int)>& uplink,
    const std::function<void(int, uint64_t)>& after_round) {
  std::vector<WorkerResult> results(spec.workers);
  Barrier joined(spec.workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < spec.workers; ++w) {
    threads.emplace_back([&, w] {
      std::function<void(uint64_t)> hook;
      if (after_round) hook = [&, w](uint64_t r) { after_round(w, r); };
      results[w] = RunWorker(spec, addresses, job, config, uplink(w), w, hook,
                             &joined);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace co2::testing
