// bytes_bench: bytes per training sample that DDP and CO2
// (fp32, bf16, int8 uplink) put on the network, at the τ used, and the
// reduction factor. Each figure is computed from the model size and measured
// in a short run:
//  - co2: N workers (threads, one AggregatorClient each) push R rounds of a
//    P-element Δ to S in-process shards over loopback gRPC; bytes = the
//    clients' ClientStats::bytes_sent (encoded payload) per sample, a sample
//    being one of the τ·B examples a worker trains on per round.
//  - ddp: N Gloo processes (this binary, --role=gloo) all-reduce P floats K
//    times, as DDP does every step; bytes = what they wrote to their sockets
//    (/proc/self/io wchar; Gloo writes with writev) per sample (B per step).
// bench/run_bytes.sh writes bench/results/bytes.json with it.
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "client/aggregator_client.h"
#include "client/collectives/process_group.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "server/service/aggregator_server.h"

ABSL_FLAG(std::string, role, "driver", "driver | gloo (internal)");
ABSL_FLAG(int, workers, 4, "Workers N (co2-train's demo uses 4).");
ABSL_FLAG(int, shards, 2, "Aggregator shards S.");
ABSL_FLAG(std::vector<std::string>, models,
          std::vector<std::string>({"fashion-mnist:80202", "charlm:148736",
                                    "5M:5000000"}),
          "name:P pairs: the models' parameter counts (co2-train's two "
          "tasks; docs/performance.md derives them) and a 5M-parameter "
          "vector like the overlap benchmark's model.");
ABSL_FLAG(std::vector<std::string>, tau, std::vector<std::string>({"8", "12"}),
          "τ values: co2-train's --tau default (8) and the JobConfig "
          "default (12).");
ABSL_FLAG(int, batch, 32,
          "Examples per worker and inner step (co2-train's "
          "--batch_size default).");
ABSL_FLAG(int, rounds, 3, "Rounds of the measured co2 run.");
ABSL_FLAG(int, ddp_steps, 3, "All-reduces of the measured ddp run.");
ABSL_FLAG(std::string, out, "", "Write the JSON report here (else stdout).");
ABSL_FLAG(std::string, scratch, "", "Rendezvous directory (default: fresh).");
// Internal: the gloo role.
ABSL_FLAG(uint64_t, params, 0, "Internal: P.");
ABSL_FLAG(int, rank, 0, "Internal: rank.");
ABSL_FLAG(std::string, prefix, "bytes", "Internal: group name.");

namespace co2::bench {
namespace {

// wchar of this process: bytes passed to write-like system calls.
uint64_t WrittenBytes() {
  std::ifstream in("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "wchar:") return value;
  }
  return 0;
}

int RunGloo() {
  const size_t p = absl::GetFlag(FLAGS_params);
  client::GroupOptions options;
  options.backend = client::Backend::kGloo;
  options.rank = absl::GetFlag(FLAGS_rank);
  options.size = absl::GetFlag(FLAGS_workers);
  options.store_dir = absl::GetFlag(FLAGS_scratch);
  options.prefix = absl::GetFlag(FLAGS_prefix);
  auto group = client::CreateProcessGroup(options);
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
    return 1;
  }
  std::vector<float> grads(p, 1.0f);
  // One warm-up, then the counted steps.
  if (!(*group)->AllReduceMean(grads.data(), p).ok()) return 1;
  const uint64_t before = WrittenBytes();
  for (int i = 0; i < absl::GetFlag(FLAGS_ddp_steps); ++i) {
    if (!(*group)->AllReduceMean(grads.data(), p).ok()) return 1;
  }
  std::printf("result %llu\n",
              static_cast<unsigned long long>(WrittenBytes() - before));
  std::fflush(stdout);
  return 0;
}

// Bytes that N Gloo ranks write per all-reduce of P floats (summed over
// ranks); NaN on failure.
double MeasureDdp(uint64_t p, const std::string& scratch, int index) {
  const int n = absl::GetFlag(FLAGS_workers);
  std::vector<Child> ranks;
  for (int r = 0; r < n; ++r) {
    std::optional<Child> child = Child::Spawn(
        {"/proc/self/exe", "--role=gloo", absl::StrCat("--params=", p),
         absl::StrCat("--rank=", r), absl::StrCat("--workers=", n),
         absl::StrCat("--ddp_steps=", absl::GetFlag(FLAGS_ddp_steps)),
         absl::StrCat("--scratch=", scratch),
         absl::StrCat("--prefix=ddp-", getpid(), "-", index)});
    if (!child) return std::nan("");
    ranks.push_back(std::move(*child));
  }
  double total = 0;
  for (Child& c : ranks) {
    std::optional<std::string> result = c.ReadUntil("result ");
    if (!result || c.Wait() != 0) return std::nan("");
    total += std::strtod(result->c_str(), nullptr);
  }
  return total / absl::GetFlag(FLAGS_ddp_steps);
}

// Encoded bytes of one worker's Δ: per shard, per 256 KiB chunk (int8 carries
// one fp32 scale per 1,024 elements of each chunk).
uint64_t ContributionBytes(uint64_t p, uint32_t s, common::Codec codec) {
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < s; ++i) {
    const size_t elements = common::ShardRangeFor(p, s, i)->size();
    for (size_t c = 0; c < common::NumChunks(elements); ++c) {
      bytes +=
          common::EncodedSize(codec, common::ChunkRange(elements, c).size());
    }
  }
  return bytes;
}

// Bytes the N workers send per round, measured: R rounds through S
// in-process shards, from ClientStats. NaN on failure.
double MeasureCo2(uint64_t p, common::Codec codec, int tau,
                  const std::vector<std::string>& addresses, int index) {
  const int n = absl::GetFlag(FLAGS_workers);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  std::vector<uint64_t> sent(static_cast<size_t>(n), 0);
  std::vector<std::thread> threads;
  std::atomic<bool> failed{false};
  for (int w = 0; w < n; ++w) {
    threads.emplace_back([&, w] {
      client::ClientOptions options;
      options.addresses = addresses;
      options.job = absl::StrCat("bytes-", index);
      options.worker_id = absl::StrCat("worker-", w);
      options.job_config = common::DefaultJobConfig(0, 0);
      options.job_config.set_tau(static_cast<uint32_t>(tau));
      options.job_config.set_min_workers(static_cast<uint32_t>(n));
      options.uplink_codec = codec;
      std::vector<float> anchor(p, 0.0f), delta(p, 1e-3f * (w + 1));
      auto client =
          client::AggregatorClient::Connect(options, absl::MakeSpan(anchor));
      if (!client.ok()) {
        std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
        failed = true;
        return;
      }
      const uint64_t start = (*client)->start_round();
      for (int i = 0; i < rounds; ++i) {
        const uint64_t r = start + static_cast<uint64_t>(i);
        const absl::Time deadline = absl::Now() + absl::Minutes(2);
        const double weight =
            static_cast<double>(tau) * absl::GetFlag(FLAGS_batch);
        absl::Status s = (*client)->Push(r, delta, weight, deadline);
        if (s.ok()) s = (*client)->WaitForUpdate(r, deadline);
        if (s.ok())
          s = (*client)->ApplyUpdate(r, absl::MakeSpan(anchor)).status();
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          failed = true;
          return;
        }
      }
      sent[static_cast<size_t>(w)] = (*client)->stats().bytes_sent;
      (void)(*client)->Leave(absl::Now() + absl::Seconds(5));
    });
  }
  for (std::thread& t : threads) t.join();
  if (failed) return std::nan("");
  double total = 0;
  for (uint64_t b : sent) total += static_cast<double>(b);
  return total / rounds;
}

int RunDriver() {
  std::string scratch = absl::GetFlag(FLAGS_scratch);
  if (scratch.empty()) {
    char dir[] = "/tmp/co2-bytes-bench-XXXXXX";
    if (mkdtemp(dir) == nullptr) return 1;
    scratch = dir;
  } else if (system(("mkdir -p '" + scratch + "'").c_str()) != 0) {
    return 1;
  }
  const int n = absl::GetFlag(FLAGS_workers);
  const uint32_t s = static_cast<uint32_t>(absl::GetFlag(FLAGS_shards));
  const double b = absl::GetFlag(FLAGS_batch);
  std::vector<std::unique_ptr<server::AggregatorServer>> servers;
  std::vector<std::string> addresses;
  for (uint32_t i = 0; i < s; ++i) {
    server::AggregatorServerOptions options;
    options.address = "127.0.0.1:0";
    options.registry.shard_index = i;
    options.registry.num_shards = s;
    auto started = server::AggregatorServer::Start(options);
    if (!started.ok()) return 1;
    addresses.push_back(absl::StrCat("127.0.0.1:", (*started)->port()));
    servers.push_back(*std::move(started));
  }
  std::ostringstream o;
  o.precision(6);
  o << "{\n\"machine\": " << MachineJson()
    << ",\n\"config\": {\"workers\": " << n << ", \"shards\": " << s
    << ", \"batch_per_worker_step\": " << b
    << ", \"co2_rounds_measured\": " << absl::GetFlag(FLAGS_rounds)
    << ", \"ddp_steps_measured\": " << absl::GetFlag(FLAGS_ddp_steps)
    << ", \"downlink_codec\": \"fp32\"},\n\"results\": [";
  int index = 0;
  bool first = true;
  for (const std::string& model : absl::GetFlag(FLAGS_models)) {
    const std::vector<std::string> parts = absl::StrSplit(model, ':');
    if (parts.size() != 2) return 2;
    const uint64_t p = std::strtoull(parts[1].c_str(), nullptr, 10);
    // DDP: a ring all-reduce sends 2(N−1)/N · 4P bytes per rank and step;
    // co2-train's report counts the 4P-byte gradient buffer instead.
    const double ddp_model =
        2.0 * (n - 1) / n * 4.0 * static_cast<double>(p) * n;
    const double ddp_measured = MeasureDdp(p, scratch, index++);
    const double ddp_per_sample_model = ddp_model / (n * b);
    const double ddp_per_sample = ddp_measured / (n * b);
    for (const std::string& tau_text : absl::GetFlag(FLAGS_tau)) {
      const int tau = std::atoi(tau_text.c_str());
      for (common::Codec codec :
           {common::Codec::kFp32, common::Codec::kBf16, common::Codec::kInt8}) {
        const double model_round =
            static_cast<double>(n) *
            static_cast<double>(ContributionBytes(p, s, codec));
        const double measured_round =
            MeasureCo2(p, codec, tau, addresses, index++);
        const double samples_per_round = static_cast<double>(n) * tau * b;
        const double co2_model = model_round / samples_per_round;
        const double co2_measured = measured_round / samples_per_round;
        // The fp32 downlink: P·4 to each worker per round.
        const double downlink =
            4.0 * static_cast<double>(p) * n / samples_per_round;
        o << (first ? "" : ",") << "\n  {\"model\": \"" << parts[0]
          << "\", \"params\": " << p << ", \"tau\": " << tau
          << ", \"codec\": \"" << common::CodecName(codec) << "\""
          << ", \"ddp_bytes_per_sample\": " << ddp_per_sample
          << ", \"ddp_bytes_per_sample_model\": " << ddp_per_sample_model
          << ", \"ddp_gradient_bytes_per_sample\": "
          << 4.0 * static_cast<double>(p) / b
          << ", \"co2_bytes_per_sample\": " << co2_measured
          << ", \"co2_bytes_per_sample_model\": " << co2_model
          << ", \"reduction\": " << ddp_per_sample / co2_measured
          << ", \"reduction_model\": " << ddp_per_sample_model / co2_model
          << ", \"co2_downlink_bytes_per_sample\": " << downlink
          << ", \"reduction_counting_downlink\": "
          << ddp_per_sample / (co2_measured + downlink) << "}";
        first = false;
        std::fprintf(
            stderr,
            "%s tau=%d %s: ddp %.0f B/sample, co2 %.1f B/sample, x%.1f\n",
            parts[0].c_str(), tau,
            std::string(common::CodecName(codec)).c_str(), ddp_per_sample,
            co2_measured, ddp_per_sample / co2_measured);
      }
    }
  }
  o << "\n]\n}\n";
  for (auto& server : servers) server->Shutdown(absl::ZeroDuration());
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cout << o.str();
    return 0;
  }
  std::ofstream(out) << o.str();
  return 0;
}

}  // namespace
}  // namespace co2::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  if (absl::GetFlag(FLAGS_role) == "gloo") return co2::bench::RunGloo();
  return co2::bench::RunDriver();
}
