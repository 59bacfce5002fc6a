// aggregator_bench: how fast S co2-aggregator shards on
// loopback take N workers' rounds of P fp32 deltas, next to the transport
// limit (iperf3 moving the same bytes over the same N·S streams) and to what
// a user would run instead (a Gloo ring all-reduce of the same P floats across
// N processes), all in one invocation; plus each shard's peak memory against
// its fp32 range. bench/run_aggregator.sh runs it; docs/performance.md
// explains the numbers.
//
// With --netns every worker (and Gloo rank) runs in its own network
// namespace and the shards in another, over the links that
// bench/run_aggregator_links.sh sets up and shapes (as hosts on their own
// links: the links, not loopback's CPU, are the limit); iperf3 then moves
// each worker's bytes over its own link (RunIperf3Links).
//
// One binary, three roles: the driver (default) starts the shards (the real
// co2-aggregator binary), the workers (this binary, --role=client, one
// process each, an AggregatorClient), iperf3 and the Gloo ranks (this binary,
// --role=gloo), steps them through a ready/go barrier over their stdin and
// stdout, and writes one JSON report.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "client/aggregator_client.h"
#include "client/collectives/process_group.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "common/malloc_settings.h"

ABSL_FLAG(std::string, role, "driver", "driver | client | gloo (internal)");
ABSL_FLAG(std::string, aggregator, "", "The co2-aggregator binary.");
ABSL_FLAG(std::vector<std::string>, workers,
          std::vector<std::string>({"2", "4", "8"}),
          "Numbers of workers N to run, one after the other.");
ABSL_FLAG(int, shards, 2, "Shards S.");
ABSL_FLAG(bool, deterministic, false,
          "JobConfig.deterministic: the shards sum exactly.");
ABSL_FLAG(std::string, downlink, "fp32",
          "The job's downlink codec: fp32 | bf16 | int8 (deltas go up as "
          "fp32).");
ABSL_FLAG(uint64_t, params, uint64_t{8} << 20, "Parameters P (fp32).");
ABSL_FLAG(int, rounds, 4,
          "Rounds (all-reduces) per repetition; the first is a warm-up.");
ABSL_FLAG(int, repetitions, 3, "Repetitions of each N; medians are reported.");
ABSL_FLAG(std::string, iperf3, "iperf3", "iperf3 binary; empty: skip it.");
ABSL_FLAG(bool, gloo, true, "Run the Gloo all-reduce reference.");
ABSL_FLAG(float, outlier_ratio, co2::common::kDefaultOutlierRatio,
          "JobConfig.outlier_ratio of the job (0: the outlier rule off).");
ABSL_FLAG(bool, outlier_off_reference, false,
          "Also run each repetition with outlier_ratio 0 and report the "
          "shards' CPU per round with the rule over without it.");
ABSL_FLAG(bool, whole_round_reference, false,
          "Also run the aggregator with --stream_updates=false (each round's "
          "update sent only once the whole round closed) in every "
          "repetition, as a reference for streaming.");
ABSL_FLAG(std::vector<std::string>, shard_flags, {},
          "More co2-aggregator flags for every shard, comma-separated "
          "(e.g. --stream_window_bytes=1048576).");
ABSL_FLAG(double, idle_s, 0,
          "Seconds every worker and Gloo rank waits between rounds, the "
          "stand-in for a round's compute: after an idle stretch longer "
          "than TCP's retransmission timeout, Linux restarts slow start "
          "unless net.ipv4.tcp_slow_start_after_idle is 0. Not counted in "
          "the round times.");
ABSL_FLAG(std::string, out, "", "Write the JSON report here (else stdout).");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Shards write a checkpoint of every round here, as deployed "
          "(deploy/k8s); empty: none.");
ABSL_FLAG(std::string, scratch, "",
          "Directory for logs and rendezvous files (default: a fresh one).");
ABSL_FLAG(std::string, copy_counter, "",
          "libco2_copy_counter.so: preloaded into the shards and worker 0, "
          "which then report the bytes they memcpy (by caller) and move "
          "through sockets.");
ABSL_FLAG(std::string, netns, "",
          "Network namespace prefix: worker i (and Gloo rank i) runs in "
          "<prefix>-w<i>, the shards in <prefix>-agg (needs root; "
          "bench/run_aggregator_links.sh creates them). Empty: loopback.");
ABSL_FLAG(std::string, shard_host, "127.0.0.1",
          "With --netns: the shards' address in <prefix>-agg.");
ABSL_FLAG(std::vector<std::string>, worker_hosts, {},
          "With --netns: worker i's address in <prefix>-w<i>, one per "
          "worker of the largest N.");
// Internal: the client and gloo roles.
ABSL_FLAG(std::string, addresses, "", "Internal: shard addresses.");
ABSL_FLAG(std::string, job, "bench", "Internal: job / group name.");
ABSL_FLAG(int, rank, 0, "Internal: this worker's index.");
ABSL_FLAG(int, size, 1, "Internal: number of workers.");
ABSL_FLAG(std::string, address, "127.0.0.1",
          "Internal: the address a Gloo rank listens on.");

namespace co2::bench {
namespace {

using Stamps = std::vector<double>;

std::string StampsJson(const Stamps& stamps) {
  std::ostringstream o;
  o.precision(17);
  o << "[";
  for (size_t i = 0; i < stamps.size(); ++i) o << (i ? ", " : "") << stamps[i];
  o << "]";
  return o.str();
}

Stamps ParseStamps(const std::string& json) {
  Stamps stamps;
  const size_t open = json.find('['), close = json.find(']');
  if (open == std::string::npos || close == std::string::npos) return stamps;
  for (absl::string_view part : absl::StrSplit(
           absl::string_view(json).substr(open + 1, close - open - 1), ',')) {
    stamps.push_back(std::strtod(std::string(part).c_str(), nullptr));
  }
  return stamps;
}

// The wait between two rounds (--idle_s); TimedRounds takes it out again.
void IdleBetweenRounds() {
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_idle_s)));
}

// A delta that differs by worker, small and finite.
std::vector<float> MakeDelta(size_t p, int rank) {
  std::vector<float> delta(p);
  for (size_t i = 0; i < p; ++i) {
    delta[i] =
        1e-3f * static_cast<float>((i + static_cast<size_t>(rank)) % 7) - 3e-3f;
  }
  return delta;
}

void WaitForGo() {
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);
}

// Tells the driver the warm-up round is over (it samples the shards' CPU
// time then) and returns this process's CPU time at that moment.
CpuTimes WarmedUp() {
  std::printf("warm\n");
  std::fflush(stdout);
  return SelfCpuTimes();
}

// The result line's CPU fields: this process's CPU time since `warm`.
std::string CpuJson(const CpuTimes& warm) {
  const CpuTimes used = SelfCpuTimes() - warm;
  return absl::StrCat("\"cpu_user_s\": ", used.user_s,
                      ", \"cpu_sys_s\": ", used.sys_s);
}

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.ToString().c_str());
  std::printf("error %s\n", what.c_str());
  return 1;
}

// One worker: joins every shard, then R synchronous rounds (push Δ_r, wait
// for U_r, apply it), stamping the end of each and timing its CPU over the
// rounds after the first.
int RunClient() {
  const size_t p = absl::GetFlag(FLAGS_params);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  client::ClientOptions options;
  options.addresses = absl::StrSplit(absl::GetFlag(FLAGS_addresses), ',');
  options.job = absl::GetFlag(FLAGS_job);
  options.worker_id = absl::StrCat("worker-", absl::GetFlag(FLAGS_rank));
  const absl::StatusOr<common::Codec> downlink =
      common::ParseCodec(absl::GetFlag(FLAGS_downlink));
  if (!downlink.ok()) return Fail("--downlink", downlink.status());
  options.job_config = common::DefaultJobConfig(0, 0);
  options.job_config.set_round_timeout_ms(600000);
  options.job_config.set_downlink_codec(v1::Codec(*downlink));
  options.job_config.set_deterministic(absl::GetFlag(FLAGS_deterministic));
  options.job_config.set_outlier_ratio(absl::GetFlag(FLAGS_outlier_ratio));
  std::vector<float> anchor(p, 0.0f);
  const std::vector<float> delta = MakeDelta(p, absl::GetFlag(FLAGS_rank));
  auto connected =
      client::AggregatorClient::Connect(options, absl::MakeSpan(anchor));
  if (!connected.ok()) return Fail("connect", connected.status());
  std::unique_ptr<client::AggregatorClient> client = *std::move(connected);
  WaitForGo();
  Stamps stamps = {MonotonicSeconds()};
  CpuTimes warm;
  const uint64_t start = client->start_round();
  for (int i = 0; i < rounds; ++i) {
    const uint64_t r = start + static_cast<uint64_t>(i);
    const absl::Time deadline = absl::Now() + absl::Minutes(5);
    absl::Status s = client->Push(r, delta, 1.0, deadline);
    if (s.ok()) s = client->WaitForUpdate(r, deadline);
    if (s.ok()) s = client->ApplyUpdate(r, absl::MakeSpan(anchor)).status();
    if (!s.ok()) return Fail(absl::StrCat("round ", r), s);
    stamps.push_back(MonotonicSeconds());
    if (i == 0) warm = WarmedUp();
    if (i + 1 < rounds) IdleBetweenRounds();
  }
  const client::ClientStats stats = client->stats();
  std::printf(
      "result {\"stamps\": %s, %s, \"bytes_sent\": %llu, "
      "\"bytes_received\": %llu}\n",
      StampsJson(stamps).c_str(), CpuJson(warm).c_str(),
      static_cast<unsigned long long>(stats.bytes_sent),
      static_cast<unsigned long long>(stats.bytes_received));
  std::fflush(stdout);
  (void)client->Leave(absl::Now() + absl::Seconds(10));
  return 0;
}

// One Gloo rank: R mean all-reduces of P floats, stamping the end of each
// and timing its CPU over the all-reduces after the first.
int RunGloo() {
  const size_t p = absl::GetFlag(FLAGS_params);
  client::GroupOptions options;
  options.backend = client::Backend::kGloo;
  options.rank = absl::GetFlag(FLAGS_rank);
  options.size = absl::GetFlag(FLAGS_size);
  options.store_dir = absl::GetFlag(FLAGS_scratch);
  options.prefix = absl::GetFlag(FLAGS_job);
  options.address = absl::GetFlag(FLAGS_address);
  options.timeout = absl::Minutes(5);
  auto group = client::CreateProcessGroup(options);
  if (!group.ok()) return Fail("gloo group", group.status());
  std::vector<float> buffer = MakeDelta(p, options.rank);
  WaitForGo();
  Stamps stamps = {MonotonicSeconds()};
  CpuTimes warm;
  for (int i = 0; i < absl::GetFlag(FLAGS_rounds); ++i) {
    absl::Status s = (*group)->AllReduceMean(buffer.data(), buffer.size());
    if (!s.ok()) return Fail("all-reduce", s);
    stamps.push_back(MonotonicSeconds());
    if (i == 0) warm = WarmedUp();
    if (i + 1 < absl::GetFlag(FLAGS_rounds)) IdleBetweenRounds();
  }
  std::printf("result {\"stamps\": %s, %s}\n", StampsJson(stamps).c_str(),
              CpuJson(warm).c_str());
  std::fflush(stdout);
  return 0;
}

// This binary, by path: /proc/self/exe would name `ip` under ip netns exec.
std::string SelfExe() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : "/proc/self/exe";
}

// Where the processes run (--netns): a command for the shards' namespace or
// worker i's, and the addresses they listen on. On loopback: as they are.
std::vector<std::string> InNetns(const std::string& suffix,
                                 std::vector<std::string> argv) {
  const std::string prefix = absl::GetFlag(FLAGS_netns);
  if (prefix.empty()) return argv;
  argv.insert(argv.begin(),
              {"ip", "netns", "exec", absl::StrCat(prefix, "-", suffix)});
  return argv;
}
std::vector<std::string> OnShardHost(std::vector<std::string> argv) {
  return InNetns("agg", std::move(argv));
}
std::vector<std::string> OnWorkerHost(int rank, std::vector<std::string> argv) {
  return InNetns(absl::StrCat("w", rank), std::move(argv));
}
std::string WorkerHost(int rank) {
  if (absl::GetFlag(FLAGS_netns).empty()) return "127.0.0.1";
  return absl::GetFlag(FLAGS_worker_hosts)[static_cast<size_t>(rank)];
}

struct Together {
  // Per round, the time the last child finished it; [0] is the release.
  // Empty on failure.
  Stamps last;
  CpuTimes cpu;  // all children's, over the rounds after the first
};

// Starts `children` (each must print "ready"), releases them together and
// collects their "result" lines. `at_warm` runs once all of them finished
// the warm-up round, `at_end` once all of them finished the last one.
Together RunTogether(
    std::vector<Child>& children, const std::function<void()>& at_warm = [] {},
    const std::function<void()>& at_end = [] {}) {
  for (Child& c : children) {
    if (!c.ReadUntil("ready")) return {};
  }
  for (Child& c : children) c.WriteLine("go");
  for (Child& c : children) {
    if (!c.ReadUntil("warm")) return {};
  }
  at_warm();
  std::vector<std::string> results;
  for (Child& c : children) {
    std::optional<std::string> result = c.ReadUntil("result ");
    if (!result) return {};
    results.push_back(*std::move(result));
  }
  at_end();
  for (Child& c : children) c.Wait();
  Together together;
  for (const std::string& result : results) {
    const Stamps s = ParseStamps(result);
    if (together.last.empty()) together.last.assign(s.size(), 0.0);
    if (s.size() != together.last.size()) return {};
    for (size_t i = 0; i < s.size(); ++i) {
      together.last[i] = std::max(together.last[i], s[i]);
    }
    together.cpu =
        together.cpu + CpuTimes{JsonNumberAfter(result, "cpu_user_s"),
                                JsonNumberAfter(result, "cpu_sys_s")};
  }
  return together;
}

// Durations of rounds 2..R (round 1 is the warm-up), less the idle wait
// before each.
std::vector<double> TimedRounds(const Stamps& last) {
  std::vector<double> d;
  for (size_t i = 2; i < last.size(); ++i) {
    d.push_back(last[i] - last[i - 1] - absl::GetFlag(FLAGS_idle_s));
  }
  return d;
}

// The first round's duration: on connections that have not carried a round
// yet (TCP's windows start cold).
double FirstRound(const Stamps& last) { return last[1] - last[0]; }

struct ShardProcess {
  std::optional<Child> child;
  int port = 0;
  uint64_t idle_rss = 0;  // VmRSS once listening, before any job
  std::string log;
  std::string copies_path;
};

// `checkpoint_dir` empty: none. Each run has its own, so that no shard
// starts by restoring an earlier run's job.
std::optional<ShardProcess> StartShard(int index, int shards,
                                       const std::string& scratch,
                                       const std::string& checkpoint_dir,
                                       bool stream_updates) {
  ShardProcess shard;
  shard.log = absl::StrCat(scratch, "/shard-", index, ".log");
  std::map<std::string, std::string> env;
  if (!absl::GetFlag(FLAGS_copy_counter).empty()) {
    shard.copies_path = absl::StrCat(scratch, "/copies-shard-", index, ".json");
    env["LD_PRELOAD"] = absl::GetFlag(FLAGS_copy_counter);
    env["CO2_COPY_COUNTER_OUT"] = shard.copies_path;
  }
  std::vector<std::string> argv = {
      absl::GetFlag(FLAGS_aggregator),
      "--insecure",
      "--host=" + absl::GetFlag(FLAGS_shard_host),
      "--port=0",
      absl::StrCat("--shard_index=", index),
      absl::StrCat("--num_shards=", shards),
      "--metrics_port=-1",
      "--lease=300s",
      "--round_timeout=600s",
      absl::StrCat("--stream_updates=", stream_updates)};
  for (const std::string& flag : absl::GetFlag(FLAGS_shard_flags)) {
    argv.push_back(flag);
  }
  if (!checkpoint_dir.empty()) {
    argv.push_back("--checkpoint_dir=" + checkpoint_dir);
  }
  std::optional<Child> child =
      Child::Spawn(OnShardHost(std::move(argv)), shard.log,
                   /*stdout_to_null=*/true, env);
  if (!child) return std::nullopt;
  shard.child = std::move(child);
  const double deadline = MonotonicSeconds() + 60;
  while (MonotonicSeconds() < deadline) {
    const std::string log = ReadFile(shard.log);
    const size_t at = log.find("listening on port ");
    if (at != std::string::npos) {
      shard.port = std::atoi(log.c_str() + at + 18);
      shard.idle_rss = ProcStatusBytes(shard.child->pid(), "VmRSS");
      return shard;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

struct Repetition {
  std::vector<double> aggregator_rounds;  // seconds per timed round
  double aggregator_first_round = 0;      // seconds, the cold round
  double iperf3_bps = std::nan("");       // receiver-side bytes per second
  // The CPU time of each, over the timed rounds (iperf3: over its run, which
  // moves the timed rounds' bytes; not measured over links).
  CpuTimes worker_cpu, shard_cpu;
  std::optional<CpuTimes> iperf3_cpu;
  std::vector<double> gloo_rounds;
  double gloo_first_round = 0;
  CpuTimes gloo_cpu;
  std::string shards_json;         // memory (and copies) per shard
  std::string client_copies_json;  // worker 0's, under the copy counter
};

// The aggregator part of one repetition, with the job's downlink codec;
// false on failure.
bool RunAggregator(int n, int rep, common::Codec downlink, bool stream_updates,
                   float outlier_ratio, const std::string& scratch,
                   Repetition* out) {
  const int s = absl::GetFlag(FLAGS_shards);
  const uint64_t p = absl::GetFlag(FLAGS_params);
  std::vector<ShardProcess> shards;
  std::vector<std::string> addresses;
  for (int i = 0; i < s; ++i) {
    const std::string checkpoint_dir =
        absl::GetFlag(FLAGS_checkpoint_dir).empty()
            ? ""
            : absl::StrCat(absl::GetFlag(FLAGS_checkpoint_dir), "/agg-", n, "-",
                           rep, stream_updates ? "" : "-whole");
    std::optional<ShardProcess> shard =
        StartShard(i, s, scratch, checkpoint_dir, stream_updates);
    if (!shard) {
      std::fprintf(stderr, "shard %d did not start (see %s/shard-%d.log)\n", i,
                   scratch.c_str(), i);
      return false;
    }
    addresses.push_back(
        absl::StrCat(absl::GetFlag(FLAGS_shard_host), ":", shard->port));
    shards.push_back(std::move(*shard));
  }
  std::vector<Child> clients;
  const std::string client_copies =
      absl::StrCat(scratch, "/copies-client-0.json");
  for (int c = 0; c < n; ++c) {
    std::map<std::string, std::string> env;
    if (c == 0 && !absl::GetFlag(FLAGS_copy_counter).empty()) {
      env["LD_PRELOAD"] = absl::GetFlag(FLAGS_copy_counter);
      env["CO2_COPY_COUNTER_OUT"] = client_copies;
    }
    std::optional<Child> child = Child::Spawn(
        OnWorkerHost(
            c, {SelfExe(), "--role=client",
                absl::StrCat("--addresses=", absl::StrJoin(addresses, ",")),
                absl::StrCat("--params=", p),
                absl::StrCat("--rounds=", absl::GetFlag(FLAGS_rounds)),
                absl::StrCat("--idle_s=", absl::GetFlag(FLAGS_idle_s)),
                "--downlink=" + std::string(common::CodecName(downlink)),
                absl::StrCat("--deterministic=",
                             absl::GetFlag(FLAGS_deterministic)),
                absl::StrCat("--outlier_ratio=", outlier_ratio),
                absl::StrCat("--job=agg-", n, "-", rep),
                absl::StrCat("--rank=", c)}),
        absl::StrCat(scratch, "/client-", c, ".log"), /*stdout_to_null=*/false,
        env);
    if (!child) return false;
    clients.push_back(std::move(*child));
  }
  auto shards_cpu = [&shards] {
    CpuTimes sum;
    for (const ShardProcess& shard : shards) {
      sum = sum + ProcCpuTimes(shard.child->pid());
    }
    return sum;
  };
  CpuTimes shards_warm;
  const Together together = RunTogether(
      clients, [&] { shards_warm = shards_cpu(); },
      [&] { out->shard_cpu = shards_cpu() - shards_warm; });
  const Stamps& last = together.last;
  if (last.empty()) {
    std::fprintf(stderr, "a client failed (see %s/client-*.log)\n",
                 scratch.c_str());
    return false;
  }
  out->aggregator_rounds = TimedRounds(last);
  out->aggregator_first_round = FirstRound(last);
  out->worker_cpu = together.cpu;
  if (!absl::GetFlag(FLAGS_copy_counter).empty()) {
    // Payload worker 0 sent (fp32 deltas) and received (updates) in its
    // rounds; its seed of the anchor, if it was the one to seed, comes on top.
    const uint64_t rounds = static_cast<uint64_t>(absl::GetFlag(FLAGS_rounds));
    out->client_copies_json =
        absl::StrCat("{\"payload_bytes_sent\": ", 4 * p * rounds,
                     ", \"payload_bytes_received\": ",
                     common::EncodedSize(downlink, p) * rounds,
                     ", \"copies\": ", ReadFile(client_copies), "}");
  }
  std::ostringstream o;
  o << "[";
  for (int i = 0; i < s; ++i) {
    ShardProcess& shard = shards[static_cast<size_t>(i)];
    const uint64_t elements = common::ShardRangeFor(p, s, i)->size();
    const uint64_t hwm = ProcStatusBytes(shard.child->pid(), "VmHWM");
    const uint64_t rss = ProcStatusBytes(shard.child->pid(), "VmRSS");
    shard.child->Signal(SIGTERM);
    shard.child->Wait();
    const double fp32 = 4.0 * static_cast<double>(elements);
    o << (i ? ", " : "") << "{\"shard\": " << i
      << ", \"fp32_range_bytes\": " << 4 * elements
      << ", \"idle_rss_bytes\": " << shard.idle_rss
      << ", \"peak_rss_bytes\": " << hwm << ", \"final_rss_bytes\": " << rss
      << ", \"peak_over_range\": " << static_cast<double>(hwm) / fp32
      << ", \"peak_minus_idle_over_range\": "
      << static_cast<double>(hwm - shard.idle_rss) / fp32;
    if (!shard.copies_path.empty()) {
      // Payload the shard took in: N contributions per round plus the seed.
      o << ", \"payload_bytes_received\": "
        << 4 * elements *
               (static_cast<uint64_t>(n) *
                    static_cast<uint64_t>(absl::GetFlag(FLAGS_rounds)) +
                1)
        << ", \"payload_bytes_sent_per_worker\": "
        << common::EncodedSize(downlink, elements) *
               static_cast<uint64_t>(absl::GetFlag(FLAGS_rounds))
        << ", \"copies\": " << ReadFile(shard.copies_path);
    }
    o << "}";
  }
  o << "]";
  out->shards_json = o.str();
  return true;
}

// An iperf3 server for one test on `port`, on the shards' host (as is on
// loopback), once it listens; nullopt if it did not start.
std::optional<Child> StartIperf3Server(int port, const std::string& log) {
  std::optional<Child> server =
      Child::Spawn(OnShardHost({absl::GetFlag(FLAGS_iperf3), "-s", "-1", "-p",
                                std::to_string(port), "--forceflush"}),
                   log);
  if (!server || !server->ReadUntil("Server listening")) return std::nullopt;
  return server;
}

// iperf3 moving `bytes` over `streams` streams on loopback.
bool RunIperf3(uint64_t bytes, int streams, const std::string& scratch,
               Repetition* out) {
  const std::string iperf3 = absl::GetFlag(FLAGS_iperf3);
  const int port = FreeLoopbackPort();
  std::optional<Child> server =
      StartIperf3Server(port, scratch + "/iperf3-server.log");
  if (!server) return false;
  std::optional<Child> client = Child::Spawn(
      {iperf3, "-c", "127.0.0.1", "-p", std::to_string(port), "-P",
       std::to_string(streams), "-n", std::to_string(bytes), "--json"},
      scratch + "/iperf3-client.log");
  if (!client) return false;
  const std::string json = client->ReadAll();
  client->Wait();
  server->Wait();
  const size_t received = json.find("\"sum_received\"");
  const size_t sent = json.find("\"sum_sent\"", json.find("\"end\""));
  if (received == std::string::npos || sent == std::string::npos) return false;
  out->iperf3_bps = JsonNumberAfter(json, "bits_per_second", received) / 8;
  // iperf3's own figures, its client (host) and server (remote) in percent
  // of the run's time.
  const size_t cpu = json.find("\"cpu_utilization_percent\"");
  if (cpu == std::string::npos) return false;
  const double seconds_per_percent =
      JsonNumberAfter(json, "seconds", sent) / 100;
  out->iperf3_cpu = CpuTimes{
      seconds_per_percent * (JsonNumberAfter(json, "host_user", cpu) +
                             JsonNumberAfter(json, "remote_user", cpu)),
      seconds_per_percent * (JsonNumberAfter(json, "host_system", cpu) +
                             JsonNumberAfter(json, "remote_system", cpu))};
  return true;
}

// With --netns: the links' limit for a worker's `up` bytes to the shards'
// host and `down` bytes back, each over `streams` streams (its S shard
// streams): iperf3 moves the uplinks of all N workers at once, then their
// downlinks, and the rate is all bytes over the longer of the two, as if
// both directions ran at once (full duplex, as a streamed round can). Run at
// the same time, iperf3's separate connections per direction often lose a
// third of the uplink: their ACKs queue behind the downlink's data in tbf.
bool RunIperf3Links(int n, uint64_t up, uint64_t down, int streams,
                    const std::string& scratch, Repetition* out) {
  const std::string iperf3 = absl::GetFlag(FLAGS_iperf3);
  double bytes = 0, longest = 0;
  for (const bool reverse : {false, true}) {
    std::vector<Child> servers, clients;
    for (int i = 0; i < n; ++i) {
      std::optional<Child> server = StartIperf3Server(
          5201 + i, absl::StrCat(scratch, "/iperf3-server-", i, ".log"));
      if (!server) return false;
      servers.push_back(std::move(*server));
    }
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> argv = {iperf3,
                                       "-c",
                                       absl::GetFlag(FLAGS_shard_host),
                                       "-p",
                                       std::to_string(5201 + i),
                                       "-P",
                                       std::to_string(streams),
                                       "-n",
                                       std::to_string(reverse ? down : up),
                                       "--json"};
      if (reverse) argv.push_back("-R");  // the server sends: the downlink
      std::optional<Child> client =
          Child::Spawn(OnWorkerHost(i, std::move(argv)),
                       absl::StrCat(scratch, "/iperf3-client-", i, ".log"));
      if (!client) return false;
      clients.push_back(std::move(*client));
    }
    double seconds = 0;
    for (Child& client : clients) {
      const std::string json = client.ReadAll();
      client.Wait();
      const size_t received = json.find("\"sum_received\"");
      if (received == std::string::npos) return false;
      bytes += JsonNumberAfter(json, "bytes", received);
      seconds = std::max(seconds, JsonNumberAfter(json, "seconds", received));
    }
    for (Child& server : servers) server.Wait();
    longest = std::max(longest, seconds);
  }
  out->iperf3_bps = bytes / longest;
  return true;
}

bool RunGlooReference(int n, int rep, const std::string& scratch,
                      Repetition* out) {
  std::vector<Child> ranks;
  for (int r = 0; r < n; ++r) {
    std::optional<Child> child = Child::Spawn(
        OnWorkerHost(r,
                     {SelfExe(), "--role=gloo",
                      absl::StrCat("--params=", absl::GetFlag(FLAGS_params)),
                      absl::StrCat("--rounds=", absl::GetFlag(FLAGS_rounds)),
                      absl::StrCat("--idle_s=", absl::GetFlag(FLAGS_idle_s)),
                      // Unique per driver: rendezvous keys must not be reused.
                      absl::StrCat("--job=gloo-", getpid(), "-", n, "-", rep),
                      absl::StrCat("--rank=", r), absl::StrCat("--size=", n),
                      absl::StrCat("--scratch=", scratch),
                      "--address=" + WorkerHost(r)}),
        absl::StrCat(scratch, "/gloo-", r, ".log"));
    if (!child) return false;
    ranks.push_back(std::move(*child));
  }
  const Together together = RunTogether(ranks);
  if (together.last.empty()) return false;
  out->gloo_rounds = TimedRounds(together.last);
  out->gloo_first_round = FirstRound(together.last);
  out->gloo_cpu = together.cpu;
  return true;
}

// A JSON number; null for NaN (a reference that was not run).
std::string Num(double x) {
  if (!std::isfinite(x)) return "null";
  std::ostringstream o;
  o.precision(6);
  o << x;
  return o.str();
}

std::string NumbersJson(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + Num(v[i]);
  return out + "]";
}

// CPU time per round of one party over the repetitions: medians of user,
// system and their sum, and the sums of each repetition.
struct CpuSeries {
  std::vector<double> user, sys, total;

  void Add(const CpuTimes& per_round) {
    user.push_back(per_round.user_s);
    sys.push_back(per_round.sys_s);
    total.push_back(per_round.user_s + per_round.sys_s);
  }
  std::string Json() const {
    return absl::StrCat("{\"user\": ", Num(Median(user)),
                        ", \"sys\": ", Num(Median(sys)),
                        ", \"total\": ", Num(Median(total)),
                        ", \"total_each\": ", NumbersJson(total), "}");
  }
};

CpuTimes PerRound(const CpuTimes& cpu, int timed_rounds) {
  return {cpu.user_s / timed_rounds, cpu.sys_s / timed_rounds};
}

// The cores `cpu` kept busy over the timed rounds `rounds` (seconds each).
double CoresBusy(const CpuTimes& cpu, const std::vector<double>& rounds) {
  return (cpu.user_s + cpu.sys_s) /
         std::accumulate(rounds.begin(), rounds.end(), 0.0);
}

int RunDriver() {
  std::string scratch = absl::GetFlag(FLAGS_scratch);
  if (scratch.empty()) {
    char dir[] = "/tmp/co2-aggregator-bench-XXXXXX";
    if (mkdtemp(dir) == nullptr) return 1;
    scratch = dir;
  } else if (system(("mkdir -p '" + scratch + "'").c_str()) != 0) {
    return 1;
  }
  if (absl::GetFlag(FLAGS_aggregator).empty()) {
    std::fprintf(stderr, "--aggregator is required\n");
    return 2;
  }
  const int s = absl::GetFlag(FLAGS_shards);
  const uint64_t p = absl::GetFlag(FLAGS_params);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (rounds < 2) {
    std::fprintf(stderr, "--rounds must be >= 2 (the first is a warm-up)\n");
    return 2;
  }
  if (!absl::GetFlag(FLAGS_netns).empty()) {
    for (const std::string& w : absl::GetFlag(FLAGS_workers)) {
      if (static_cast<size_t>(std::atoi(w.c_str())) >
          absl::GetFlag(FLAGS_worker_hosts).size()) {
        std::fprintf(stderr,
                     "--worker_hosts names %zu hosts; --workers=%s needs one "
                     "per worker\n",
                     absl::GetFlag(FLAGS_worker_hosts).size(), w.c_str());
        return 2;
      }
    }
  }
  const std::string downlink_name = absl::GetFlag(FLAGS_downlink);
  const absl::StatusOr<common::Codec> downlink =
      common::ParseCodec(downlink_name);
  if (!downlink.ok()) {
    std::fprintf(stderr, "--downlink: %s\n",
                 std::string(downlink.status().message()).c_str());
    return 2;
  }
  std::ostringstream o;
  o << "{\n\"machine\": " << MachineJson()
    << ",\n\"config\": {\"params\": " << p << ", \"shards\": " << s
    << ", \"rounds\": " << rounds << ", \"timed_rounds\": " << rounds - 1
    << ", \"repetitions\": " << absl::GetFlag(FLAGS_repetitions)
    << ", \"uplink_codec\": \"fp32\", \"downlink_codec\": \"" << downlink_name
    << "\", \"staleness\": 1"
    << ", \"deterministic\": "
    << (absl::GetFlag(FLAGS_deterministic) ? "true" : "false")
    << ", \"copy_counter\": " << !absl::GetFlag(FLAGS_copy_counter).empty()
    << ", \"checkpoints\": " << !absl::GetFlag(FLAGS_checkpoint_dir).empty()
    << ", \"netns\": " << !absl::GetFlag(FLAGS_netns).empty()
    << ", \"idle_s\": " << absl::GetFlag(FLAGS_idle_s) << ", \"shard_flags\": \""
    << absl::StrJoin(absl::GetFlag(FLAGS_shard_flags), " ") << "\""
    << "},\n\"runs\": [";
  bool first = true;
  for (const std::string& w : absl::GetFlag(FLAGS_workers)) {
    const int n = std::atoi(w.c_str());
    // Payload through the shards per round: N deltas in, N updates out.
    const double round_bytes =
        n * (4.0 * static_cast<double>(p) +
             static_cast<double>(common::EncodedSize(*downlink, p)));
    std::vector<double> agg_first_round, gloo_first_round;
    std::vector<double> goodput, vs_iperf3, vs_gloo, agg_round, gloo_round,
        iperf3_bps, whole_round, vs_whole, cpu_vs_iperf3, cpu_vs_gloo,
        outlier_vs_off,
        agg_cores, iperf3_cores, gloo_cores;
    CpuSeries workers_cpu, shards_cpu, agg_cpu, iperf3_cpu, gloo_cpu;
    std::vector<std::string> shard_reports, client_copies;
    for (int rep = 0; rep < absl::GetFlag(FLAGS_repetitions); ++rep) {
      Repetition r;
      const float k = absl::GetFlag(FLAGS_outlier_ratio);
      if (!RunAggregator(n, rep, *downlink, /*stream_updates=*/true, k,
                         scratch, &r)) {
        return 1;
      }
      if (absl::GetFlag(FLAGS_outlier_off_reference)) {
        Repetition off;
        if (!RunAggregator(n, rep, *downlink, /*stream_updates=*/true, 0,
                           scratch, &off)) {
          return 1;
        }
        const CpuTimes with = r.shard_cpu, without = off.shard_cpu;
        outlier_vs_off.push_back((with.user_s + with.sys_s) /
                                 (without.user_s + without.sys_s));
        std::fprintf(stderr,
                     "N=%d rep %d: shards' CPU with outlier_ratio %g / "
                     "without: %.3f\n",
                     n, rep, k, outlier_vs_off.back());
      }
      const double round_s = Median(r.aggregator_rounds);
      if (absl::GetFlag(FLAGS_whole_round_reference)) {
        Repetition whole;
        if (!RunAggregator(n, rep, *downlink, /*stream_updates=*/false,
                           absl::GetFlag(FLAGS_outlier_ratio), scratch,
                           &whole)) {
          return 1;
        }
        whole_round.push_back(Median(whole.aggregator_rounds));
        vs_whole.push_back(whole_round.back() / round_s);
      }
      agg_round.push_back(round_s);
      agg_first_round.push_back(r.aggregator_first_round);
      goodput.push_back(round_bytes / round_s);
      workers_cpu.Add(PerRound(r.worker_cpu, rounds - 1));
      shards_cpu.Add(PerRound(r.shard_cpu, rounds - 1));
      agg_cpu.Add(PerRound(r.worker_cpu + r.shard_cpu, rounds - 1));
      agg_cores.push_back(
          CoresBusy(r.worker_cpu + r.shard_cpu, r.aggregator_rounds));
      shard_reports.push_back(r.shards_json);
      if (!r.client_copies_json.empty()) {
        client_copies.push_back(r.client_copies_json);
      }
      if (!absl::GetFlag(FLAGS_iperf3).empty()) {
        const uint64_t bytes = static_cast<uint64_t>(round_bytes) *
                               static_cast<uint64_t>(rounds - 1);
        const uint64_t timed = static_cast<uint64_t>(rounds - 1);
        const bool ok =
            absl::GetFlag(FLAGS_netns).empty()
                ? RunIperf3(bytes, n * s, scratch, &r)
                : RunIperf3Links(n, 4 * p * timed,
                                 common::EncodedSize(*downlink, p) * timed, s,
                                 scratch, &r);
        if (!ok) {
          std::fprintf(stderr, "iperf3 failed (see %s/iperf3-*.log)\n",
                       scratch.c_str());
          return 1;
        }
        iperf3_bps.push_back(r.iperf3_bps);
        vs_iperf3.push_back(goodput.back() / r.iperf3_bps);
        if (r.iperf3_cpu) {
          iperf3_cpu.Add(PerRound(*r.iperf3_cpu, rounds - 1));
          iperf3_cores.push_back(iperf3_cpu.total.back() /
                                 (round_bytes / r.iperf3_bps));
          cpu_vs_iperf3.push_back(iperf3_cpu.total.back() /
                                  agg_cpu.total.back());
        }
      }
      if (absl::GetFlag(FLAGS_gloo)) {
        if (!RunGlooReference(n, rep, scratch, &r)) {
          std::fprintf(stderr, "gloo failed (see %s/gloo-*.log)\n",
                       scratch.c_str());
          return 1;
        }
        gloo_round.push_back(Median(r.gloo_rounds));
        gloo_first_round.push_back(r.gloo_first_round);
        vs_gloo.push_back(gloo_round.back() / round_s);
        gloo_cpu.Add(PerRound(r.gloo_cpu, rounds - 1));
        gloo_cores.push_back(CoresBusy(r.gloo_cpu, r.gloo_rounds));
        cpu_vs_gloo.push_back(gloo_cpu.total.back() / agg_cpu.total.back());
      }
      std::fprintf(
          stderr,
          "N=%d rep %d: round %.3f s (whole-round close %.3f s), "
          "goodput %.2f GB/s, iperf3 %.2f GB/s, gloo all-reduce "
          "%.3f s; CPU per round: aggregator %.3f s, iperf3 %.3f s, "
          "gloo %.3f s\n",
          n, rep, round_s, whole_round.empty() ? 0.0 : whole_round.back(),
          goodput.back() / 1e9,
          iperf3_bps.empty() ? 0.0 : iperf3_bps.back() / 1e9,
          gloo_round.empty() ? 0.0 : gloo_round.back(), agg_cpu.total.back(),
          iperf3_cpu.total.empty() ? 0.0 : iperf3_cpu.total.back(),
          gloo_cpu.total.empty() ? 0.0 : gloo_cpu.total.back());
    }
    o << (first ? "" : ",") << "\n  {\"workers\": " << n
      << ", \"streams\": " << n * s
      << ", \"payload_bytes_per_round\": " << static_cast<uint64_t>(round_bytes)
      << ",\n   \"aggregator\": {\"round_s_median\": " << Num(Median(agg_round))
      << ", \"round_s\": " << NumbersJson(agg_round)
      << ", \"first_round_s\": " << NumbersJson(agg_first_round)
      << ", \"goodput_bytes_per_s_median\": " << Num(Median(goodput)) << "}"
      << ",\n   \"iperf3\": {\"bytes_per_s_median\": "
      << Num(Median(iperf3_bps))
      << ", \"bytes_per_s\": " << NumbersJson(iperf3_bps) << "}"
      << ",\n   \"aggregator_whole_rounds\": {\"round_s_median\": "
      << Num(Median(whole_round))
      << ", \"round_s\": " << NumbersJson(whole_round) << "}"
      << ",\n   \"gloo_allreduce\": {\"round_s_median\": "
      << Num(Median(gloo_round)) << ", \"round_s\": " << NumbersJson(gloo_round)
      << ", \"first_round_s\": " << NumbersJson(gloo_first_round)
      << "}"
      << ",\n   \"ratios\": {\"goodput_over_iperf3\": "
      << Num(Median(vs_iperf3))
      << ", \"goodput_over_iperf3_each\": " << NumbersJson(vs_iperf3)
      << ", \"gloo_round_over_aggregator_round\": " << Num(Median(vs_gloo))
      << ", \"gloo_round_over_aggregator_round_each\": " << NumbersJson(vs_gloo)
      << ", \"shard_cpu_outlier_rule_over_off\": " << Num(Median(outlier_vs_off))
      << ", \"shard_cpu_outlier_rule_over_off_each\": "
      << NumbersJson(outlier_vs_off)
      << ", \"whole_round_over_aggregator_round\": " << Num(Median(vs_whole))
      << ", \"whole_round_over_aggregator_round_each\": "
      << NumbersJson(vs_whole)
      << ", \"iperf3_cpu_over_aggregator_cpu\": " << Num(Median(cpu_vs_iperf3))
      << ", \"iperf3_cpu_over_aggregator_cpu_each\": "
      << NumbersJson(cpu_vs_iperf3)
      << ", \"gloo_cpu_over_aggregator_cpu\": " << Num(Median(cpu_vs_gloo))
      << ", \"gloo_cpu_over_aggregator_cpu_each\": " << NumbersJson(cpu_vs_gloo)
      << "}"
      << ",\n   \"cpu_s_per_round\": {\"aggregator\": " << agg_cpu.Json()
      << ", \"workers\": " << workers_cpu.Json()
      << ", \"shards\": " << shards_cpu.Json()
      << ",\n     \"iperf3\": " << iperf3_cpu.Json()
      << ", \"gloo\": " << gloo_cpu.Json() << "}"
      << ",\n   \"cores_busy\": {\"aggregator\": " << Num(Median(agg_cores))
      << ", \"iperf3\": " << Num(Median(iperf3_cores))
      << ", \"gloo\": " << Num(Median(gloo_cores)) << "}"
      << ",\n   \"shards\": [" << absl::StrJoin(shard_reports, ",\n     ")
      << "]";
    if (!client_copies.empty()) {
      o << ",\n   \"client_copies\": ["
        << absl::StrJoin(client_copies, ",\n     ") << "]";
    }
    o << "}";
    first = false;
  }
  o << "\n]\n}\n";
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cout << o.str();
  } else {
    FILE* f = std::fopen(out.c_str(), "w");
    if (f == nullptr) return 1;
    std::fputs(o.str().c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace co2::bench

int main(int argc, char** argv) {
  // As co2-train's main does: the workers stand in for it (and the Gloo ranks
  // for what it would run instead).
  co2::common::KeepLargeBuffersInHeap();
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "client") return co2::bench::RunClient();
  if (role == "gloo") return co2::bench::RunGloo();
  return co2::bench::RunDriver();
}
