// co2-aggregator: serves one shard (index i of S) of the CO2 outer step for
// any number of jobs. Stops cleanly on SIGTERM / SIGINT.
#include <pthread.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/flags_help.h"
#include "common/host_tcp.h"
#include "common/logging.h"
#include "common/malloc_settings.h"
#include "common/metrics_server.h"
#include "common/status_macros.h"
#include "common/tls_config.h"
#include "server/job/round_deadline.h"
#include "server/service/aggregator_server.h"
#include "server/service/health_server.h"
#include "server/service/shard_metrics.h"
#include "server/service/shard_ordinal.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 50051, "Port to listen on (0 picks a free one).");
ABSL_FLAG(int, shard_index, 0, "This shard's index i in [0, num_shards).");
ABSL_FLAG(int, num_shards, 1, "Number of shards S of the service.");
ABSL_FLAG(int, min_workers, 1,
          "Quorum for closing a round at its deadline, for jobs that leave "
          "JobConfig.min_workers at 0.");
ABSL_FLAG(
    absl::Duration, round_timeout, absl::Seconds(60),
    "Round deadline, for jobs that leave JobConfig.round_timeout_ms at 0.");
ABSL_FLAG(absl::Duration, lease, absl::Seconds(10),
          "A worker that sends nothing for this long leaves the rounds.");
ABSL_FLAG(int, max_jobs, 64, "Jobs this shard accepts.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Directory for this shard's checkpoints (written atomically after "
          "every round, before its update is released; jobs found there are "
          "restored at start). Empty: no checkpoints.");
ABSL_FLAG(int, max_workers, 1024, "Workers per job.");
ABSL_FLAG(bool, adaptive_round_deadline, false,
          "Learn a round's deadline from completion times: "
          "--round_deadline_factor x the 95th percentile of how long the last "
          "32 complete rounds took from their first contribution to their "
          "last, at least --round_deadline_floor, at most the job's "
          "round_timeout; a dead worker then costs seconds, not the timeout.");
ABSL_FLAG(double, round_deadline_factor, 4.0,
          "With --adaptive_round_deadline: the multiple of the percentile.");
ABSL_FLAG(absl::Duration, round_deadline_floor, absl::Seconds(5),
          "With --adaptive_round_deadline: the shortest deadline.");
ABSL_FLAG(absl::Duration, abandon_after, absl::Minutes(10),
          "A job with rounds left and no live worker for this long is "
          "abandoned: it leaves the rounds, metrics and alerts; a worker that "
          "joins it again resumes it.");
ABSL_FLAG(absl::Duration, job_retention, absl::Hours(1),
          "How long a finished or abandoned job stays in memory; its "
          "checkpoint stays on disk, and a finished job's name stays taken "
          "until `co2-admin delete`.");
// Operations (docs/operations.md).
ABSL_FLAG(double, link_mbit, 0,
          "The rate of the path between this shard and its workers, Mbit/s "
          "(0: not said). With --link_rtt the shard logs at start whether "
          "the host's TCP settings let one stream fill it, and exports "
          "co2_tcp_stream_cap_bits_per_second against it.");
ABSL_FLAG(absl::Duration, link_rtt, absl::ZeroDuration(),
          "The round trip of that path (e.g. 100ms; 0: not said).");
ABSL_FLAG(int, metrics_port, 9464,
          "Port of the Prometheus /metrics endpoint on --host (0 picks a "
          "free one; -1 turns it off).");
ABSL_FLAG(int, health_port, -1,
          "Plaintext port on --host serving only grpc.health.v1.Health, for "
          "probes that cannot speak TLS (Kubernetes gRPC probes); -1: off "
          "(the health service is also on --port).");
ABSL_FLAG(bool, shard_index_from_hostname, false,
          "Take the shard index from the hostname's -N suffix (pod N of a "
          "Kubernetes StatefulSet) instead of --shard_index.");
ABSL_FLAG(uint64_t, max_parameters, uint64_t{1} << 32,
          "Largest JobConfig.num_parameters (P) a job may declare; the shard "
          "holds 4 to 6 x 4 bytes per element of its range "
          "(docs/algorithm.md).");
ABSL_FLAG(int, max_message_bytes, 8 << 20,
          "Largest gRPC message accepted (a 256 KiB chunk plus headers fits).");
ABSL_FLAG(int, stream_window_bytes, 0,
          "HTTP/2 receive window of each worker stream: what a worker may "
          "send ahead of the shard's reads (held in the shard's memory). "
          "0: each window grows with its path (gRPC's BDP probe), all of "
          "them within --stream_memory_bytes. N > 0 fixes every window at N "
          "bytes: a stream then moves at most about N per round trip.");
ABSL_FLAG(int64_t, stream_memory_bytes, int64_t{256} << 20,
          "gRPC memory the worker streams' receive buffers may hold in all; "
          "as it fills, the windows shrink (docs/operations.md, Long links).");
ABSL_FLAG(bool, stream_updates, true,
          "Step and send each chunk of a round's update as soon as every "
          "worker of the round has sent that chunk, while the rest still "
          "arrives (the same bits; false waits for the whole round). With "
          "--checkpoint_dir each such chunk is first synced to the round "
          "journal beside the checkpoint.");
ABSL_FLAG(int, max_rejected_chunks, 3,
          "A worker whose contributions fail validation (NaN/Inf, bad size) "
          "this many times in a row is evicted from its job.");
// Access control (docs/reliability.md).
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of this shard.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle that signs worker certificates; when given, workers "
          "must present one (mTLS).");
ABSL_FLAG(std::string, job_tokens_file, "",
          "File of `job token` lines (`*` as the job: any job): the bearer "
          "token each job's workers must send. Needs TLS.");
ABSL_FLAG(std::string, token, "",
          "One bearer token for every job (visible in ps; prefer "
          "--job_tokens_file). Needs TLS.");
ABSL_FLAG(std::string, admin_token_file, "",
          "File holding the bearer token of the admin service (co2-admin: "
          "list and delete jobs). Needs --job_tokens_file or --token; "
          "without tokens the shard takes admin calls from any client.");
ABSL_FLAG(bool, insecure, false,
          "Serve plaintext gRPC with no authentication. Only for a trusted, "
          "isolated network; without it the shard refuses to start with no "
          "TLS material.");

namespace {

// TLS and tokens from the flags. Plaintext only with --insecure, and then
// loudly; never tokens without TLS.
absl::Status ReadSecurityFlags(co2::server::AggregatorServerOptions* options) {
  const bool insecure = absl::GetFlag(FLAGS_insecure);
  co2::common::TlsOptions& tls = options->tls;
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  tls.require_client_cert = !tls.ca_file.empty();
  const std::string tokens_file = absl::GetFlag(FLAGS_job_tokens_file);
  const std::string token = absl::GetFlag(FLAGS_token);
  if (!tokens_file.empty() && !token.empty()) {
    return absl::InvalidArgumentError(
        "give --job_tokens_file or --token, not both");
  }
  if (insecure) {
    if (tls.enabled() || !tokens_file.empty() || !token.empty()) {
      return absl::InvalidArgumentError(
          "--insecure serves plaintext without authentication; it cannot be "
          "combined with --tls_* or tokens");
    }
    CO2_LOG(WARNING)
        << "INSECURE: --insecure given: serving plaintext gRPC with no "
           "authentication; anyone who can reach this port can join any job "
           "and read its parameters. Use only on a trusted, isolated network.";
    return absl::OkStatus();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "refusing to serve without TLS: give --tls_cert and --tls_key (and "
        "--tls_client_ca to require worker certificates, --job_tokens_file "
        "for per-job tokens), or --insecure for a trusted, isolated network");
  }
  if (!tokens_file.empty()) {
    CO2_ASSIGN_OR_RETURN(options->tokens,
                         co2::server::LoadJobTokensFile(tokens_file));
  } else if (!token.empty()) {
    options->tokens.any_job = token;
  }
  const std::string admin_file = absl::GetFlag(FLAGS_admin_token_file);
  if (!admin_file.empty()) {
    if (options->tokens.empty()) {
      return absl::InvalidArgumentError(
          "--admin_token_file needs --job_tokens_file or --token: a shard "
          "without job tokens checks no token and takes admin calls from "
          "every client");
    }
    CO2_ASSIGN_OR_RETURN(options->tokens.admin,
                         co2::common::ReadTokenFile(admin_file));
  }
  if (options->tokens.empty()) {
    CO2_LOG(WARNING) << "no bearer tokens (--job_tokens_file / --token): any "
                     << (tls.require_client_cert
                             ? "client with a certificate from --tls_client_ca"
                             : "client that completes the TLS handshake")
                     << " may join any job";
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  co2::common::SetUpFlagsHelp(
      __FILE__,
      "one shard of the CO2 aggregation service.\n"
      "  co2-aggregator --shard_index=i --num_shards=S [--port=50051]\n"
      "  --tls_cert=F --tls_key=F [--tls_client_ca=F] [--job_tokens_file=F]\n"
      "  or --insecure (plaintext, trusted networks only)",
      argc, argv);
  absl::ParseCommandLine(argc, argv);
  // Before any thread: every round allocates and frees buffers of 1–32 MiB;
  // with glibc's defaults rounds took 1.15–1.4 × as long, with a slightly
  // higher peak (docs/performance.md, Server memory).
  co2::common::KeepLargeBuffersInHeap();
  const absl::StatusOr<int> resolved_shard = co2::server::ResolveShardIndex(
      absl::GetFlag(FLAGS_shard_index),
      absl::GetFlag(FLAGS_shard_index_from_hostname));
  if (!resolved_shard.ok()) {
    std::cerr << "error: " << resolved_shard.status().message() << "\n";
    return 2;
  }
  const int shard_index = *resolved_shard;
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
  co2::server::RoundDeadlineOptions& deadline =
      options.registry.shard.round_deadline;
  deadline.adaptive = absl::GetFlag(FLAGS_adaptive_round_deadline);
  deadline.factor = absl::GetFlag(FLAGS_round_deadline_factor);
  deadline.floor = absl::GetFlag(FLAGS_round_deadline_floor);
  if (absl::Status s = co2::server::ValidateRoundDeadlineOptions(deadline);
      !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
  }
  if (absl::Status s = ReadSecurityFlags(&options); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
  }
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.stream_window_bytes = absl::GetFlag(FLAGS_stream_window_bytes);
  options.stream_memory_bytes = absl::GetFlag(FLAGS_stream_memory_bytes);
  options.registry.max_parameters = absl::GetFlag(FLAGS_max_parameters);
  options.registry.shard.max_rejected_chunks =
      absl::GetFlag(FLAGS_max_rejected_chunks);
  options.registry.shard.stream_updates = absl::GetFlag(FLAGS_stream_updates);
  options.address = absl::StrCat(absl::GetFlag(FLAGS_host), ":",
                                 absl::GetFlag(FLAGS_port));
  options.registry.shard_index = shard_index;
  options.registry.num_shards = num_shards;
  options.registry.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  options.registry.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options.registry.shard.lease = absl::GetFlag(FLAGS_lease);
  options.registry.shard.max_workers = absl::GetFlag(FLAGS_max_workers);
  options.registry.shard.abandon_after = absl::GetFlag(FLAGS_abandon_after);
  options.registry.retention = absl::GetFlag(FLAGS_job_retention);
  options.registry.default_min_workers = absl::GetFlag(FLAGS_min_workers);
  options.registry.default_round_timeout = absl::GetFlag(FLAGS_round_timeout);

  // Block the stop signals in every thread (they inherit the mask) and take
  // them synchronously below: no work in a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const co2::common::LinkPath link_path{absl::GetFlag(FLAGS_link_mbit) * 1e6,
                                        absl::GetFlag(FLAGS_link_rtt)};
  if (absl::Status s = co2::common::CheckLinkPathAndLogHostTcp(link_path);
      !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
  }

  // Metrics first: the shard reports to them from its first call. They are
  // declared before the server, so they outlive it.
  std::unique_ptr<co2::common::MetricsServer> metrics;
  std::unique_ptr<co2::server::ShardMetrics> shard_metrics;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    co2::common::MetricsServerOptions metrics_options;
    metrics_options.program = "co2-aggregator";
    metrics_options.link_path = link_path;
    metrics_options.address = absl::StrCat(absl::GetFlag(FLAGS_host), ":",
                                           absl::GetFlag(FLAGS_metrics_port));
    auto started = co2::common::MetricsServer::Start(metrics_options);
    if (!started.ok()) {
      std::cerr << "error: " << started.status() << "\n";
      return 1;
    }
    metrics = *std::move(started);
    // The port a --metrics_port=0 picked, for whoever started the shard.
    CO2_LOG(INFO) << "metrics on port " << metrics->port();
    shard_metrics = std::make_unique<co2::server::ShardMetrics>(
        metrics->registry(), shard_index);
    options.registry.shard.observer = shard_metrics.get();
  }
  auto server = co2::server::AggregatorServer::Start(options);
  if (!server.ok()) {
    std::cerr << "error: " << server.status() << "\n";
    return 1;
  }
  std::unique_ptr<co2::server::HealthServer> health;
  if (absl::GetFlag(FLAGS_health_port) >= 0) {
    auto started = co2::server::HealthServer::Start(absl::StrCat(
        absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_health_port)));
    if (!started.ok()) {
      std::cerr << "error: " << started.status() << "\n";
      return 1;
    }
    health = *std::move(started);
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  CO2_LOG(INFO) << "signal " << signal << ": shutting down";
  if (health != nullptr) health->Shutdown(absl::ZeroDuration());
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}
