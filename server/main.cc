// co2-aggregator: serves one shard (index i of S) of the CO2 outer step for
// any number of jobs. Stops cleanly on SIGTERM / SIGINT.
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>
#include <pthread.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/aggregator_server.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 50051, "Port to listen on (0 picks a free one).");
ABSL_FLAG(int, shard_index, 0, "This shard's index i in [0, num_shards).");
ABSL_FLAG(int, num_shards, 1, "Number of shards S of the service.");
ABSL_FLAG(int, min_workers, 1,
          "Quorum for closing a round at its deadline, for jobs that leave "
          "JobConfig.min_workers at 0.");
ABSL_FLAG(absl::Duration, round_timeout, absl::Seconds(60),
          "Round deadline, for jobs that leave JobConfig.round_timeout_ms at 0.");
ABSL_FLAG(absl::Duration, lease, absl::Seconds(10),
          "A worker that sends nothing for this long leaves the rounds.");
ABSL_FLAG(int, max_jobs, 64, "Jobs this shard accepts.");
ABSL_FLAG(int, max_workers, 1024, "Workers per job.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "co2-aggregator --shard_index=i --num_shards=S [--port=50051]");
  absl::ParseCommandLine(argc, argv);
  const int shard_index = absl::GetFlag(FLAGS_shard_index);
  const int num_shards = absl::GetFlag(FLAGS_num_shards);
  if (num_shards < 1 || shard_index < 0 || shard_index >= num_shards) {
    std::cerr << "error: --shard_index=" << shard_index
              << " must be in [0, --num_shards=" << num_shards << ")\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_min_workers) < 1 ||
      absl::GetFlag(FLAGS_round_timeout) <= absl::ZeroDuration()) {
    std::cerr << "error: --min_workers must be >= 1 and --round_timeout > 0\n";
    return 2;
  }
  co2::server::AggregatorServerOptions options;
  options.address = absl::StrCat(absl::GetFlag(FLAGS_host), ":",
                                 absl::GetFlag(FLAGS_port));
  options.registry.shard_index = shard_index;
  options.registry.num_shards = num_shards;
  options.registry.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  options.registry.shard.lease = absl::GetFlag(FLAGS_lease);
  options.registry.shard.max_workers = absl::GetFlag(FLAGS_max_workers);
  options.registry.default_min_workers = absl::GetFlag(FLAGS_min_workers);
  options.registry.default_round_timeout = absl::GetFlag(FLAGS_round_timeout);

  // Block the stop signals in every thread (they inherit the mask) and take
  // them synchronously below: no work in a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto server = co2::server::AggregatorServer::Start(options);
  if (!server.ok()) {
    std::cerr << "error: " << server.status() << "\n";
    return 1;
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  CO2_LOG(INFO) << "signal " << signal << ": shutting down";
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}
