// co2-admin: an operator's view of the aggregator shards' jobs, through
// their admin service (co2.v1.AggregatorAdmin): `list` prints every job of
// every shard with its state; `delete JOB` forgets a finished or abandoned
// job (or an open one without workers) on every shard and removes its
// checkpoint files, so that its name can be used again. Exit status: 0 done,
// 1 a shard refused or failed (its error printed), 2 usage error.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "co2/v1/aggregator.grpc.pb.h"
#include "common/flags_help.h"
#include "common/grpc_status.h"
#include "common/tls_config.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "server/job/job_lifecycle.h"

ABSL_FLAG(std::string, aggregators, "localhost:50051",
          "host:port of every shard, comma-separated.");
ABSL_FLAG(std::string, ca, "",
          "PEM CA that signs the shards' certificates (TLS); empty: "
          "plaintext.");
ABSL_FLAG(std::string, cert, "",
          "PEM client certificate, for shards that require one (mTLS).");
ABSL_FLAG(std::string, key, "", "PEM private key of --cert.");
ABSL_FLAG(std::string, admin_token_file, "",
          "File holding the shards' admin token (their --admin_token_file).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10),
          "Deadline of each call to a shard.");

namespace {

constexpr char kUsage[] =
    "operator calls to the CO2 aggregator shards.\n"
    "  co2-admin [--aggregators=H:P,...] [--ca=F [--cert=F --key=F]]\n"
    "            [--admin_token_file=F] list | delete JOB";

absl::StatusOr<std::unique_ptr<co2::v1::AggregatorAdmin::Stub>> Connect(
    const std::string& address) {
  co2::common::TlsOptions tls;
  tls.ca_file = absl::GetFlag(FLAGS_ca);
  tls.cert_file = absl::GetFlag(FLAGS_cert);
  tls.key_file = absl::GetFlag(FLAGS_key);
  std::string token;
  if (const std::string file = absl::GetFlag(FLAGS_admin_token_file);
      !file.empty()) {
    absl::StatusOr<std::string> read = co2::common::ReadTokenFile(file);
    if (!read.ok()) return read.status();
    token = *read;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      co2::common::MakeChannelCredentials(tls, token, "admin");
  if (!credentials.ok()) return credentials.status();
  return co2::v1::AggregatorAdmin::NewStub(
      grpc::CreateChannel(address, *credentials));
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(
      absl::ToChronoTime(absl::Now() + absl::GetFlag(FLAGS_timeout)));
}

int Fail(const std::string& address, const absl::Status& status) {
  std::fprintf(stderr, "co2-admin: shard %s: %s\n", address.c_str(),
               status.ToString().c_str());
  return 1;
}

int List(const std::vector<std::string>& addresses) {
  int exit_code = 0;
  std::printf("%-22s %-24s %-10s %-14s %5s %12s %s\n", "SHARD", "JOB",
              "STATE", "ROUND/ROUNDS", "LIVE", "IN STATE", "WHERE");
  for (const std::string& address : addresses) {
    auto stub = Connect(address);
    if (!stub.ok()) return Fail(address, stub.status());
    grpc::ClientContext context;
    SetDeadline(&context);
    co2::v1::ListJobsResponse response;
    const absl::Status status = co2::common::FromGrpcStatus(
        (*stub)->ListJobs(&context, co2::v1::ListJobsRequest(), &response));
    if (!status.ok()) {
      exit_code = Fail(address, status);
      continue;
    }
    for (const co2::v1::JobSummary& job : response.jobs()) {
      const std::string round =
          job.rounds() == 0
              ? absl::StrCat(job.open_round(), "/-")
              : absl::StrCat(job.open_round(), "/", job.rounds());
      std::printf("%-22s %-24s %-10s %-14s %5u %11.0fs %s\n", address.c_str(),
                  job.job().c_str(),
                  std::string(co2::server::JobStateName(job.state())).c_str(),
                  round.c_str(), job.live_workers(), job.seconds_in_state(),
                  job.in_memory() ? "memory" : "disk");
    }
  }
  return exit_code;
}

int Delete(const std::vector<std::string>& addresses, const std::string& job) {
  int exit_code = 0;
  for (const std::string& address : addresses) {
    auto stub = Connect(address);
    if (!stub.ok()) return Fail(address, stub.status());
    grpc::ClientContext context;
    SetDeadline(&context);
    co2::v1::DeleteJobRequest request;
    request.set_job(job);
    co2::v1::DeleteJobResponse response;
    const absl::Status status = co2::common::FromGrpcStatus(
        (*stub)->DeleteJob(&context, request, &response));
    if (!status.ok()) {
      exit_code = Fail(address, status);
      continue;
    }
    std::printf("shard %s: deleted job %s", address.c_str(), job.c_str());
    for (const std::string& file : response.removed_files()) {
      std::printf(" (removed %s)", file.c_str());
    }
    std::printf("\n");
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  co2::common::SetUpFlagsHelp(__FILE__, kUsage, argc, argv);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::vector<std::string> addresses =
      absl::StrSplit(absl::GetFlag(FLAGS_aggregators), ',', absl::SkipEmpty());
  if (addresses.empty()) {
    std::fprintf(stderr, "co2-admin: --aggregators names no shard\n%s\n",
                 kUsage);
    return 2;
  }
  if (args.size() == 2 && std::string(args[1]) == "list") return List(addresses);
  if (args.size() == 3 && std::string(args[1]) == "delete") {
    return Delete(addresses, args[2]);
  }
  std::fprintf(stderr, "co2-admin: expected `list` or `delete JOB`\n  %s\n",
               kUsage);
  return 2;
}
