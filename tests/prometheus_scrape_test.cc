// A real Prometheus server (Debian's /usr/bin/prometheus) scrapes two
// in-process aggregator shards and the metrics endpoints of two worker leaders
// while they run CO2 rounds over loopback gRPC; the test then asks
// Prometheus's HTTP API for the series and checks their values against what
// the workers did. Prometheus also loads deploy/prometheus/alerts.yml, so the
// shipped alert rules are evaluated against real series. Every wait is
// bounded; Prometheus is killed on every exit path.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "client/aggregator_client.h"
#include "client/worker_metrics.h"
#include "common/job_config.h"
#include "common/metrics_server.h"
#include "gtest/gtest.h"
#include "server/service/aggregator_server.h"
#include "server/service/shard_metrics.h"
#include "tests/http_get.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2 {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr size_t kParams = 300000;  // two shards, several chunks each
constexpr uint32_t kShards = 2;
constexpr int kWorkers = 2;
constexpr uint64_t kRounds = 6;
constexpr char kJob[] = "scrape";
const absl::Duration kWait = absl::Seconds(90);  // any one wait in this test

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

// Every "expr" string of the Grafana dashboard (JSON-unescaped), with its
// template variables replaced by values a query can run with.
std::vector<std::string> DashboardQueries(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
  std::vector<std::string> queries;
  const std::string key = "\"expr\": \"";
  for (size_t at = json.find(key); at != std::string::npos;
       at = json.find(key, at)) {
    std::string expr;
    for (at += key.size(); at < json.size() && json[at] != '"'; ++at) {
      if (json[at] == '\\' && at + 1 < json.size()) ++at;  // \" and \\ only
      expr.push_back(json[at]);
    }
    for (const auto& [variable, value] :
         std::vector<std::pair<std::string, std::string>>{
             {"$__rate_interval", "1m"},
             {"$__range", "5m"},
             {"$co2_job", ".*"}}) {
      for (size_t v = expr.find(variable); v != std::string::npos;
           v = expr.find(variable, v + value.size())) {
        expr.replace(v, variable.size(), value);
      }
    }
    queries.push_back(expr);
  }
  return queries;
}

// One aggregator shard with its own /metrics endpoint, as co2-aggregator runs.
struct Shard {
  std::unique_ptr<common::MetricsServer> metrics;
  std::unique_ptr<server::ShardMetrics> observer;
  std::unique_ptr<server::AggregatorServer> server;
};

// Prometheus as a child process, killed (and reaped) on destruction.
class PrometheusProcess {
 public:
  // Starts it with `config` in `dir`; false if the fork fails.
  bool Start(const std::string& dir, int port) {
    dir_ = dir;
    port_ = port;
    const std::vector<std::string> args = {
        kPrometheus, absl::StrCat("--config.file=", dir, "/prometheus.yml"),
        absl::StrCat("--storage.tsdb.path=", dir, "/data"),
        absl::StrCat("--web.listen-address=127.0.0.1:", port),
        "--log.level=warn"};
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const std::string log = LogPath();
    pid_ = fork();
    if (pid_ == 0) {  // only async-signal-safe calls until exec
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execv(kPrometheus, argv.data());
      _exit(127);
    }
    return pid_ > 0;
  }

  ~PrometheusProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  bool Exited() const {
    return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == pid_;
  }

  std::string LogPath() const { return dir_ + "/prometheus.log"; }
  std::string Log() const {
    std::ifstream in(LogPath());
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  absl::StatusOr<std::string> Get(const std::string& path) const {
    return testing::HttpGet(port_, path, absl::Seconds(10));
  }

  // The value of a PromQL expression with one sample (e.g. a sum()).
  // NOT_FOUND while the result is empty.
  absl::StatusOr<double> Query(const std::string& promql) const {
    absl::StatusOr<std::string> body =
        Get(absl::StrCat("/api/v1/query?query=", UrlEncode(promql)));
    if (!body.ok()) return body.status();
    if (!absl::StrContains(*body, "\"status\":\"success\"")) {
      return absl::InternalError(absl::StrCat(promql, ": ", *body));
    }
    const size_t value = body->find("\"value\":[");
    if (value == std::string::npos) {
      return absl::NotFoundError(absl::StrCat(promql, ": empty result"));
    }
    const size_t open = body->find(",\"", value);
    const size_t close = body->find('"', open + 2);
    double v = 0;
    if (open == std::string::npos || close == std::string::npos ||
        !absl::SimpleAtod(body->substr(open + 2, close - open - 2), &v)) {
      return absl::InternalError(
          absl::StrCat(promql, ": cannot parse ", *body));
    }
    return v;
  }

 private:
  pid_t pid_ = -1;
  std::string dir_;
  int port_ = 0;
};

// A worker leader: the CO2 boundary protocol, timed into WorkerMetrics. Keeps
// its membership (and so the active-worker gauge) until `release`.
void RunWorker(const std::vector<std::string>& addresses,
               const v1::JobConfig& config, int worker,
               client::WorkerMetrics* metrics, absl::Notification* done,
               absl::Notification* release, absl::Status* status) {
  std::vector<float> anchor(kParams, 1.0f), delta(kParams);
  client::ClientOptions options;
  options.addresses = addresses;
  options.job = kJob;
  options.worker_id = absl::StrCat("worker-", worker);
  options.job_config = config;
  auto connected =
      client::AggregatorClient::Connect(options, absl::MakeSpan(anchor));
  if (!connected.ok()) {
    *status = connected.status();
    done->Notify();
    return;
  }
  client::AggregatorClient& c = **connected;
  const absl::Time deadline = absl::Now() + kWait;
  auto run = [&]() -> absl::Status {
    for (uint64_t r = 0; r < kRounds; ++r) {
      for (size_t j = 0; j < kParams; ++j) {
        delta[j] = static_cast<float>((j + worker + r) % 7) / 1024.0f;
      }
      client::WorkerRoundSample sample;
      sample.inner_steps = 4;
      sample.compute = absl::Milliseconds(20);
      sample.staleness = r > 0 ? 1 : 0;
      absl::Time t = absl::Now();
      if (r > 0) {
        if (auto s = c.WaitForUpdate(r - 1, deadline); !s.ok()) return s;
      }
      sample.exposed_comm = absl::Now() - t;
      t = absl::Now();
      if (auto s = c.Push(r, delta, 1.0, deadline); !s.ok()) return s;
      sample.push = absl::Now() - t;
      sample.bytes_sent = kParams * sizeof(float);
      if (r > 0) {
        if (auto a = c.ApplyUpdate(r - 1, absl::MakeSpan(anchor)); !a.ok()) {
          return a.status();
        }
      }
      metrics->ObserveRound(sample);
    }
    if (auto s = c.WaitForUpdate(kRounds - 1, deadline); !s.ok()) return s;
    return c.ApplyUpdate(kRounds - 1, absl::MakeSpan(anchor)).status();
  };
  *status = run();
  done->Notify();
  release->WaitForNotificationWithTimeout(kWait);
  c.Leave(absl::Now() + absl::Seconds(5)).IgnoreError();
}

TEST(PrometheusScrapeTest, PrometheusSeesTheAggregatorAndWorkerSeries) {
  if (access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus << " missing (make deps installs prometheus)";
  }
  // The shards and the workers' endpoints.
  std::vector<Shard> shards(kShards);
  std::vector<std::string> addresses, aggregator_targets, worker_targets;
  for (uint32_t i = 0; i < kShards; ++i) {
    common::MetricsServerOptions metrics_options;
    metrics_options.address = "127.0.0.1:0";
    auto metrics = common::MetricsServer::Start(metrics_options);
    CO2_ASSERT_OK(metrics);
    shards[i].metrics = *std::move(metrics);
    shards[i].observer = std::make_unique<server::ShardMetrics>(
        shards[i].metrics->registry(), i);
    server::AggregatorServerOptions options;
    options.address = "127.0.0.1:0";
    options.registry.shard_index = i;
    options.registry.num_shards = kShards;
    options.registry.shard.observer = shards[i].observer.get();
    auto started = server::AggregatorServer::Start(options);
    CO2_ASSERT_OK(started);
    shards[i].server = *std::move(started);
    addresses.push_back(absl::StrCat("127.0.0.1:", shards[i].server->port()));
    aggregator_targets.push_back(
        absl::StrCat("'127.0.0.1:", shards[i].metrics->port(), "'"));
  }
  std::vector<std::unique_ptr<client::WorkerMetrics>> worker_metrics;
  for (int w = 0; w < kWorkers; ++w) {
    auto m = client::WorkerMetrics::Serve("127.0.0.1:0", kJob,
                                          absl::StrCat("worker-", w));
    CO2_ASSERT_OK(m);
    worker_targets.push_back(absl::StrCat("'127.0.0.1:", (*m)->port(), "'"));
    worker_metrics.push_back(*std::move(m));
  }

  // Prometheus, scraping every second, with the shipped alert rules.
  const co2::testing::TempDir temp_dir("co2-prometheus");
  const std::string& dir = temp_dir.path();
  {
    std::ofstream config(dir + "/prometheus.yml");
    config << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
           << "rule_files:\n  - '" << CO2_SOURCE_DIR
           << "/deploy/prometheus/alerts.yml'\n"
           << "scrape_configs:\n"
           << "  - job_name: co2-aggregator\n    static_configs:\n"
           << "      - targets: [" << absl::StrJoin(aggregator_targets, ", ")
           << "]\n"
           << "  - job_name: co2-worker\n    static_configs:\n"
           << "      - targets: [" << absl::StrJoin(worker_targets, ", ")
           << "]\n";
  }
  const int port = FreePort();
  ASSERT_GT(port, 0);
  PrometheusProcess prometheus;
  ASSERT_TRUE(prometheus.Start(dir, port));

  // The workers train while Prometheus starts.
  v1::JobConfig config = common::DefaultJobConfig(kParams, kShards);
  config.set_min_workers(kWorkers);
  std::vector<absl::Notification> done(kWorkers);
  absl::Notification release;
  std::vector<absl::Status> status(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back(RunWorker, addresses, config, w,
                         worker_metrics[w].get(), &done[w], &release,
                         &status[w]);
  }
  struct Joiner {
    absl::Notification* release;
    std::vector<std::thread>* threads;
    ~Joiner() {
      if (!release->HasBeenNotified()) release->Notify();
      for (auto& t : *threads) t.join();
    }
  } joiner{&release, &threads};
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(done[w].WaitForNotificationWithTimeout(kWait));
    CO2_ASSERT_OK(status[w]) << "worker " << w;
  }

  // Wait for a scrape taken after the last round: every expectation below
  // holds at once (or the wait times out, showing the last values).
  const double bytes_per_worker = kRounds * kParams * sizeof(float);
  struct Expectation {
    std::string promql;
    double min;
    double max;
  };
  const std::vector<Expectation> expectations = {
      {"sum(up)", 4, 4},
      {"sum(co2_aggregator_rounds_completed_total)", kShards * kRounds,
       kShards * kRounds},
      {"sum(co2_aggregator_round_duration_seconds_count)", kShards * kRounds,
       kShards * kRounds},
      {"sum(co2_aggregator_contributions_total)", kShards * kRounds * kWorkers,
       kShards * kRounds * kWorkers},
      {"sum(co2_aggregator_bytes_in_total{codec=\"fp32\"})",
       kWorkers * bytes_per_worker, 1e18},
      // Each update goes to both workers' streams (a replay is not counted).
      {"sum(co2_aggregator_bytes_out_total{codec=\"fp32\"})", bytes_per_worker,
       1e18},
      {"min(co2_aggregator_active_workers{co2_job=\"scrape\"})", kWorkers,
       kWorkers},
      // No series until a first rejection.
      {"sum(co2_aggregator_rejected_chunks_total) or vector(0)", 0, 0},
      {"sum(co2_aggregator_quorum_misses_total)", 0, 0},
      {"count(co2_aggregator_checkpoint_duration_seconds_count)", kShards,
       kShards},
      {"min(co2_aggregator_gap_penalty_mean)", 1, 1e9},
      {"max(co2_aggregator_outer_momentum_norm)", 1e-9, 1e9},
      {"max(co2_aggregator_clipped_fraction)", 0, 1},
      {"sum(co2_worker_rounds_total)", kWorkers * kRounds, kWorkers * kRounds},
      {"sum(co2_worker_bytes_sent_total)", kWorkers * bytes_per_worker,
       kWorkers * bytes_per_worker},
      {"sum(co2_worker_exposed_comm_seconds_count)", kWorkers * kRounds,
       kWorkers * kRounds},
      {"sum(co2_worker_inner_step_seconds_count)", kWorkers * kRounds * 4,
       kWorkers * kRounds * 4},
      {"max(co2_worker_staleness_rounds)", 1, 1},
      {"sum(co2_worker_push_seconds_count)", kWorkers * kRounds,
       kWorkers * kRounds},
  };
  const absl::Time deadline = absl::Now() + kWait;
  std::vector<std::string> failing;
  do {
    failing.clear();
    ASSERT_FALSE(prometheus.Exited()) << "prometheus exited:\n"
                                      << prometheus.Log();
    for (const Expectation& e : expectations) {
      absl::StatusOr<double> v = prometheus.Query(e.promql);
      if (!v.ok() || *v < e.min || *v > e.max) {
        failing.push_back(absl::StrCat(
            e.promql, " = ", v.ok() ? absl::StrCat(*v) : v.status().ToString(),
            ", want [", e.min, ", ", e.max, "]"));
      }
    }
    if (!failing.empty()) absl::SleepFor(absl::Milliseconds(500));
  } while (!failing.empty() && absl::Now() < deadline);
  EXPECT_TRUE(failing.empty())
      << absl::StrJoin(failing, "\n") << "\nprometheus log:\n"
      << prometheus.Log();

  // Every panel query of the shipped dashboard is valid PromQL that
  // Prometheus evaluates (an empty result is fine: e.g. no rejections).
  const std::vector<std::string> panels =
      DashboardQueries(CO2_SOURCE_DIR "/deploy/grafana/co2-dashboard.json");
  EXPECT_GE(panels.size(), 20u);
  for (const std::string& promql : panels) {
    absl::StatusOr<std::string> body =
        prometheus.Get(absl::StrCat("/api/v1/query?query=", UrlEncode(promql)));
    EXPECT_TRUE(body.ok() && absl::StrContains(*body, "\"status\":\"success\""))
        << promql << ": " << (body.ok() ? *body : body.status().ToString());
  }

  // The shipped alert rules loaded and evaluate cleanly on these series, and
  // none fires for a healthy job.
  absl::StatusOr<std::string> rules = prometheus.Get("/api/v1/rules");
  CO2_ASSERT_OK(rules);
  absl::StatusOr<std::string> alerts = prometheus.Get("/api/v1/alerts");
  CO2_ASSERT_OK(alerts);
  for (const char* alert :
       {"Co2RoundStuck", "Co2QuorumMisses", "Co2ContributionsRejected",
        "Co2AggregatorDown", "Co2CommunicationExposed"}) {
    EXPECT_TRUE(
        absl::StrContains(*rules, absl::StrCat("\"name\":\"", alert, "\"")))
        << alert << " not loaded: " << *rules;
  }
  EXPECT_FALSE(absl::StrContains(*rules, "\"health\":\"err\"")) << *rules;
  // Not even pending. (Co2CommunicationExposed may be: these workers do
  // nothing but communicate, so they wait most of the time.)
  for (const char* alert : {"Co2RoundStuck", "Co2QuorumMisses",
                            "Co2ContributionsRejected", "Co2AggregatorDown"}) {
    EXPECT_FALSE(absl::StrContains(
        *alerts, absl::StrCat("\"alertname\":\"", alert, "\"")))
        << *alerts;
  }
  EXPECT_FALSE(absl::StrContains(*alerts, "\"state\":\"firing\"")) << *alerts;
}

}  // namespace
}  // namespace co2
