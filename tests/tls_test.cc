// Access control over real gRPC: TLS, mTLS and per-job bearer tokens, with a
// CA (and a second, foreign CA) generated on the spot with the openssl CLI.
// Each refusal is paired with the same call succeeding with the right
// material, so no test passes because nothing works.
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/aggregator_client.h"
#include "co2/v1/aggregator.grpc.pb.h"
#include "common/job_config.h"
#include "common/tls_config.h"
#include "common/tls_probe.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/service/aggregator_server.h"
#include "server/service/call_auth.h"
#include "server/service/client_cert.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2 {
namespace {

using grpc::StatusCode;

constexpr size_t kParams = 1000;

// Runs a shell command; returns its exit status and output (stdout+stderr).
int RunCommand(const std::string& command, std::string* output = nullptr) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string out;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0)
    out.append(buffer, n);
  const int status = pclose(pipe);
  if (output != nullptr) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A CA with a server certificate (SAN localhost, 127.0.0.1) and a client
// certificate, plus a second CA with its own client and server certificates.
class Pki {
 public:
  static const Pki& Get() {
    static const Pki* pki = new Pki();
    return *pki;
  }
  std::string Path(const std::string& name) const { return dir_.Path(name); }
  const std::string& error() const { return error_; }

 private:
  Pki() {
    // The Pki is never destroyed (see Get), so neither is its TempDir.
    std::atexit([] { std::filesystem::remove_all(Get().dir_.path()); });
    Write("server.ext",
          "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
          "extendedKeyUsage=serverAuth\n");
    Write("client.ext", "extendedKeyUsage=clientAuth\n");
    for (const std::string ca : {"ca", "other-ca"}) {
      Step(absl::StrCat(
          "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
          "-nodes -days 2 -subj '/CN=co2 test ", ca, "' -keyout ", Path(ca),
          ".key -out ", Path(ca), ".pem -addext "
          "basicConstraints=critical,CA:TRUE -addext "
          "keyUsage=critical,keyCertSign,cRLSign"));
      Sign(ca, ca == "ca" ? "server" : "other-server", "localhost", "server.ext");
      Sign(ca, ca == "ca" ? "client" : "other-client", "worker-0", "client.ext");
    }
  }

  void Sign(const std::string& ca, const std::string& name,
            const std::string& cn, const std::string& ext) {
    Step(absl::StrCat(
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-subj '/CN=", cn, "' -keyout ", Path(name), ".key -out ", Path(name),
        ".csr"));
    Step(absl::StrCat("openssl x509 -req -days 2 -in ", Path(name), ".csr -CA ",
                      Path(ca), ".pem -CAkey ", Path(ca), ".key -CAcreateserial ",
                      "-CAserial ", Path(ca), ".srl -extfile ", Path(ext),
                      " -out ", Path(name), ".pem"));
  }

  void Step(const std::string& command) {
    std::string output;
    if (error_.empty() && RunCommand(command, &output) != 0) {
      error_ = absl::StrCat(command, " failed:\n", output);
    }
  }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(Path(name)) << text;
  }

  const co2::testing::TempDir dir_{"co2-tls-test"};
  std::string error_;
};

common::TlsOptions ServerTls(bool mtls) {
  const Pki& pki = Pki::Get();
  common::TlsOptions tls;
  tls.cert_file = pki.Path("server.pem");
  tls.key_file = pki.Path("server.key");
  if (mtls) {
    tls.ca_file = pki.Path("ca.pem");
    tls.require_client_cert = true;
  }
  return tls;
}

// `client`: "client", "other-client" or "" (no certificate); `ca`: the CA
// the client trusts for the server's certificate.
common::TlsOptions ClientTls(const std::string& client,
                             const std::string& ca = "ca") {
  const Pki& pki = Pki::Get();
  common::TlsOptions tls;
  tls.ca_file = pki.Path(ca + ".pem");
  if (!client.empty()) {
    tls.cert_file = pki.Path(client + ".pem");
    tls.key_file = pki.Path(client + ".key");
  }
  return tls;
}

v1::JobConfig Config() {
  v1::JobConfig c = common::DefaultJobConfig(kParams, 1);
  c.set_min_workers(1);
  return c;
}

class CountingObserver : public server::ShardObserver {
 public:
  void OnCallRefused(absl::StatusCode) override { refused_.fetch_add(1); }
  int Refused() const { return refused_.load(); }

 private:
  std::atomic<int> refused_{0};
};

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(Pki::Get().error(), "") << "could not create the test PKI";
  }

  void StartServer(bool mtls, server::JobTokens tokens = {},
                   server::ShardObserver* observer = nullptr) {
    server::AggregatorServerOptions options;
    options.registry.shard.observer = observer;
    options.address = "127.0.0.1:0";
    options.tls = ServerTls(mtls);
    options.tokens = std::move(tokens);
    auto s = server::AggregatorServer::Start(options);
    CO2_ASSERT_OK(s);
    server_ = *std::move(s);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  std::unique_ptr<v1::Aggregator::Stub> Stub(
      std::shared_ptr<grpc::ChannelCredentials> credentials) {
    return v1::Aggregator::NewStub(grpc::CreateChannel(address_, credentials));
  }
  std::unique_ptr<v1::Aggregator::Stub> Stub(const common::TlsOptions& tls,
                                             const std::string& token = "",
                                             const std::string& job = "job-a") {
    auto credentials = common::MakeChannelCredentials(tls, token, job);
    CO2_EXPECT_OK(credentials);
    return Stub(*credentials);
  }

  static grpc::Status Join(v1::Aggregator::Stub* stub,
                           const std::string& job = "job-a",
                           const std::string& worker = "worker-0") {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::JoinRequest request;
    request.set_job(job);
    request.set_worker_id(worker);
    *request.mutable_config() = Config();
    request.set_uplink_codec(v1::CODEC_FP32);
    v1::JoinResponse response;
    return stub->Join(&context, request, &response);
  }

  // grpc.health.v1.Health/Check over a channel made from `tls`.
  grpc::Status CheckHealth(const common::TlsOptions& tls) {
    auto channel = grpc::CreateChannel(
        address_, *common::MakeChannelCredentials(tls, "", ""));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    // grpc.health.v1.HealthCheckRequest{} serialises to zero bytes.
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    grpc::GenericStub generic(channel);
    grpc::Status status;
    bool done = false;
    absl::Mutex mu;
    generic.UnaryCall(&context, "/grpc.health.v1.Health/Check",
                      grpc::StubOptions(), &request, &response,
                      [&](grpc::Status s) {
                        absl::MutexLock lock(&mu);
                        status = s;
                        done = true;
                      });
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&done));
    return status;
  }

  std::unique_ptr<server::AggregatorServer> server_;
  std::string address_;
};

void ExpectStatus(const grpc::Status& s, StatusCode code,
                  const std::string& message_part) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(message_part), std::string::npos)
      << "message: " << s.error_message()
      << "\nexpected to contain: " << message_part;
}

TEST_F(TlsTest, PlaintextClientIsRefusedWhenTlsIsRequired) {
  StartServer(/*mtls=*/false);
  const grpc::Status plaintext =
      Join(Stub(grpc::InsecureChannelCredentials()).get());
  EXPECT_EQ(plaintext.error_code(), StatusCode::UNAVAILABLE)
      << plaintext.error_message();
  CO2_EXPECT_OK(Join(Stub(ClientTls("")).get()));
  // Through the client library the user is told what to check.
  std::vector<float> anchor(kParams);
  client::ClientOptions options;
  options.addresses = {address_};
  options.worker_id = "worker-0";
  options.job_config = Config();
  options.connect_timeout = absl::Seconds(1);
  auto connected =
      client::AggregatorClient::Connect(options, absl::MakeSpan(anchor));
  ASSERT_FALSE(connected.ok());
  EXPECT_NE(connected.status().message().find("this client uses plaintext"),
            std::string::npos)
      << connected.status();
}

TEST_F(TlsTest, ClientRefusesAServerItsCaDidNotSign) {
  StartServer(/*mtls=*/false);
  const grpc::Status foreign = Join(Stub(ClientTls("", "other-ca")).get());
  EXPECT_EQ(foreign.error_code(), StatusCode::UNAVAILABLE)
      << foreign.error_message();
  CO2_EXPECT_OK(Join(Stub(ClientTls("")).get()));
}

// The shard refuses a call without a good client certificate where it knows
// the peer: UNAUTHENTICATED saying why, counted (and logged) as a refused
// call. Plaintext never gets past the handshake.
TEST_F(TlsTest, MtlsRefusesClientCertificatesFromAnotherCa) {
  CountingObserver observer;
  StartServer(/*mtls=*/true, {}, &observer);
  ExpectStatus(Join(Stub(ClientTls("other-client")).get()),
               StatusCode::UNAUTHENTICATED,
               "is not signed by the CA of this shard's --tls_client_ca");
  ExpectStatus(Join(Stub(ClientTls("")).get()), StatusCode::UNAUTHENTICATED,
               "no client certificate: this shard requires mTLS");
  EXPECT_EQ(observer.Refused(), 2);
  const grpc::Status plaintext =
      Join(Stub(grpc::InsecureChannelCredentials()).get());
  EXPECT_EQ(plaintext.error_code(), StatusCode::UNAVAILABLE)
      << plaintext.error_message();
  CO2_EXPECT_OK(Join(Stub(ClientTls("client")).get()));
  EXPECT_EQ(observer.Refused(), 2);
  // Health probes need no certificate.
  const grpc::Status health = CheckHealth(ClientTls(""));
  CO2_EXPECT_OK(health);
}

// A TLS failure that no retry can mend ends Connect at once with its reason
// (not a 30 s wait ending in "tcp handshaker shutdown"); a shard that is down
// is still waited for.
TEST_F(TlsTest, PermanentTlsFailuresFailFastSayingWhy) {
  auto connect = [&](const common::TlsOptions& tls) {
    std::vector<float> anchor(kParams);
    client::ClientOptions options;
    options.addresses = {address_};
    options.worker_id = "worker-0";
    options.job_config = Config();
    options.tls = tls;
    options.connect_timeout = absl::Minutes(5);
    return client::AggregatorClient::Connect(options, absl::MakeSpan(anchor))
        .status();
  };
  auto expect_refused = [](const absl::Status& status,
                           const std::string& part) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
    EXPECT_NE(status.message().find(part), std::string::npos)
        << status << "\nexpected to contain: " << part;
  };
  StartServer(/*mtls=*/true);
  expect_refused(connect(ClientTls("client", "other-ca")),
                 "the shard's certificate failed verification");
  expect_refused(connect(ClientTls("other-client")),
                 "is not signed by the CA of this shard's --tls_client_ca");
  expect_refused(connect(ClientTls("")), "no client certificate");
  CO2_EXPECT_OK(connect(ClientTls("client")));

  CO2_EXPECT_OK(common::ProbeTlsHandshake(address_, ClientTls("client"),
                                          absl::Seconds(5)));
  server_.reset();
  const absl::Status down = common::ProbeTlsHandshake(
      address_, ClientTls("client"), absl::Seconds(5));
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
}

server::JobTokens Tokens() {
  server::JobTokens tokens;
  tokens.per_job["job-a"] = "secret-a";
  tokens.per_job["job-b"] = "secret-b";
  return tokens;
}

TEST_F(TlsTest, WrongOrMissingTokenIsUnauthenticated) {
  StartServer(/*mtls=*/true, Tokens());
  const common::TlsOptions tls = ClientTls("client");
  ExpectStatus(Join(Stub(tls, "wrong", "job-a").get()),
               StatusCode::UNAUTHENTICATED,
               "bearer token is not valid for job \"job-a\"");
  // Job b's token does not open job a.
  ExpectStatus(Join(Stub(tls, "secret-b", "job-a").get()),
               StatusCode::UNAUTHENTICATED, "not valid for job \"job-a\"");
  ExpectStatus(Join(Stub(tls).get()), StatusCode::UNAUTHENTICATED,
               "no bearer token");
  ExpectStatus(Join(Stub(tls, "secret-c", "job-c").get(), "job-c"),
               StatusCode::UNAUTHENTICATED,
               "no token is configured for job \"job-c\"");
  // The token's secret never appears in what the client is told.
  const grpc::Status wrong = Join(Stub(tls, "secret-b", "job-a").get());
  EXPECT_EQ(wrong.error_message().find("secret"), std::string::npos);
  CO2_EXPECT_OK(Join(Stub(tls, "secret-a", "job-a").get()));
  CO2_EXPECT_OK(Join(Stub(tls, "secret-b", "job-b").get(), "job-b"));
}

TEST_F(TlsTest, TokenForOneJobCannotActOnAnother) {
  StartServer(/*mtls=*/true, Tokens());
  // Valid token and header for job a, but the request names job b.
  auto stub = Stub(ClientTls("client"), "secret-a", "job-a");
  ExpectStatus(Join(stub.get(), "job-b"), StatusCode::PERMISSION_DENIED,
               "token is for job \"job-a\", the request names job \"job-b\"");
  CO2_ASSERT_OK(Join(stub.get(), "job-a"));
  grpc::ClientContext context;
  v1::HeartbeatRequest request;
  request.set_job("job-b");
  request.set_worker_id("worker-0");
  v1::HeartbeatResponse response;
  ExpectStatus(stub->Heartbeat(&context, request, &response),
               StatusCode::PERMISSION_DENIED, "job-b");
  EXPECT_FALSE(server_->registry()->Find("job-b").ok());
}

TEST_F(TlsTest, AnyJobTokenOpensEveryJobWithoutItsOwn) {
  server::JobTokens tokens = Tokens();
  tokens.any_job = "service-token";
  StartServer(/*mtls=*/false, tokens);
  const common::TlsOptions tls = ClientTls("");
  CO2_EXPECT_OK(Join(Stub(tls, "service-token", "job-z").get(), "job-z"));
  // A job with its own token needs that one.
  ExpectStatus(Join(Stub(tls, "service-token", "job-a").get()),
               StatusCode::UNAUTHENTICATED, "job-a");
}

// The admin service takes the admin token and nothing else; a shard
// without one refuses every admin call.
TEST_F(TlsTest, AdminCallsNeedTheAdminToken) {
  auto list = [&](const std::string& token) {
    auto credentials =
        common::MakeChannelCredentials(ClientTls("client"), token, "job-a");
    CO2_EXPECT_OK(credentials);
    auto stub = v1::AggregatorAdmin::NewStub(
        grpc::CreateChannel(address_, *credentials));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::ListJobsResponse response;
    return stub->ListJobs(&context, v1::ListJobsRequest(), &response);
  };
  server::JobTokens tokens = Tokens();
  StartServer(/*mtls=*/true, tokens);
  ExpectStatus(list("secret-a"), StatusCode::UNAUTHENTICATED,
               "admin calls are disabled on this shard");
  server_.reset();
  tokens.admin = "admin-secret";
  StartServer(/*mtls=*/true, tokens);
  ExpectStatus(list("secret-a"), StatusCode::UNAUTHENTICATED,
               "need the shard's admin token");
  ExpectStatus(list(""), StatusCode::UNAUTHENTICATED,
               "need the shard's admin token");
  CO2_EXPECT_OK(list("admin-secret"));
  // The admin token opens no job.
  ExpectStatus(Join(Stub(ClientTls("client"), "admin-secret", "job-a").get()),
               StatusCode::UNAUTHENTICATED, "not valid for job \"job-a\"");
}

TEST_F(TlsTest, FullRoundThroughAggregatorClientWithMtlsAndToken) {
  StartServer(/*mtls=*/true, Tokens());
  std::vector<float> anchor(kParams);
  for (size_t j = 0; j < kParams; ++j) anchor[j] = static_cast<float>(j) / 8;
  client::ClientOptions options;
  options.addresses = {address_};
  options.job = "job-a";
  options.worker_id = "worker-0";
  options.job_config = Config();
  options.tls = ClientTls("client");
  options.token = "secret-a";
  options.connect_timeout = absl::Seconds(20);
  auto connected =
      client::AggregatorClient::Connect(options, absl::MakeSpan(anchor));
  CO2_ASSERT_OK(connected);
  client::AggregatorClient& client = **connected;
  const std::vector<float> delta(kParams, 0.25f);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  CO2_ASSERT_OK(client.Push(0, delta, 1.0, deadline));
  CO2_ASSERT_OK(client.WaitForUpdate(0, deadline));
  auto round = client.ApplyUpdate(0, absl::MakeSpan(anchor));
  CO2_ASSERT_OK(round);
  uint64_t server_round = 0;
  auto job = server_->registry()->Find("job-a");
  CO2_ASSERT_OK(job);
  const std::vector<float> server_anchor =
      (*job)->AnchorForTesting(&server_round);
  EXPECT_EQ(*round, server_round);
  EXPECT_EQ(anchor, server_anchor);
  EXPECT_NE(anchor[1], 1.0f / 8) << "the update moved nothing";
  CO2_EXPECT_OK(client.Leave(absl::Now() + absl::Seconds(5)));

  // The same client with a wrong token fails at Connect, with the code.
  options.worker_id = "worker-1";
  options.token = "wrong";
  options.connect_timeout = absl::Seconds(5);
  auto refused =
      client::AggregatorClient::Connect(options, absl::MakeSpan(anchor));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated)
      << refused.status();
}

TEST_F(TlsTest, HealthChecksNeedNoToken) {
  StartServer(/*mtls=*/false, Tokens());
  const grpc::Status status = CheckHealth(ClientTls(""));
  CO2_EXPECT_OK(status);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ClientCertVerifierTest, AcceptsOnlyClientCertificatesFromItsCa) {
  const Pki& pki = Pki::Get();
  ASSERT_EQ(pki.error(), "");
  auto verifier = server::ClientCertVerifier::Create(
      ReadFile(pki.Path("ca.pem")), pki.Path("ca.pem"));
  CO2_ASSERT_OK(verifier);
  CO2_EXPECT_OK((*verifier)->VerifyPem(ReadFile(pki.Path("client.pem")), ""));
  // A server certificate of the same CA may not authenticate a client.
  const absl::Status server_cert =
      (*verifier)->VerifyPem(ReadFile(pki.Path("server.pem")), "");
  EXPECT_EQ(server_cert.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(server_cert.message().find("\"/CN=localhost\" refused"),
            std::string::npos)
      << server_cert;
  const absl::Status foreign =
      (*verifier)->VerifyPem(ReadFile(pki.Path("other-client.pem")), "");
  EXPECT_NE(foreign.message().find("not signed by the CA"), std::string::npos)
      << foreign;
  // The CA itself, sent as the chain, does not make a foreign leaf good.
  EXPECT_FALSE((*verifier)
                   ->VerifyPem(ReadFile(pki.Path("other-client.pem")),
                               ReadFile(pki.Path("other-ca.pem")))
                   .ok());
  EXPECT_EQ(server::ClientCertVerifier::Create("not pem", "ca.txt").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TlsConfigTest, UnreadableFilesAreNamed) {
  common::TlsOptions tls;
  tls.cert_file = "/nonexistent/server.pem";
  tls.key_file = "/nonexistent/server.key";
  auto missing = server::MakeShardCredentials(tls, {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/server.pem"),
            std::string::npos)
      << missing.status();

  const co2::testing::TempDir dir("co2-tls-test");
  const std::string not_pem = dir.Path("not-pem.txt");
  std::ofstream(not_pem) << "hello\n";
  tls.cert_file = not_pem;
  auto garbage = server::MakeShardCredentials(tls, {});
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.status().message().find("not PEM"), std::string::npos)
      << garbage.status();

  tls.key_file = "";
  EXPECT_EQ(server::MakeShardCredentials(tls, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  common::TlsOptions mtls_without_ca = ServerTls(false);
  mtls_without_ca.require_client_cert = true;
  EXPECT_EQ(server::MakeShardCredentials(mtls_without_ca, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TlsConfigTest, TokenFilesHoldOneToken) {
  const co2::testing::TempDir dir("co2-tls-test");
  const std::string path = dir.Path("token");
  std::ofstream(path) << "  s3cret \nignored\n";
  auto token = common::ReadTokenFile(path);
  CO2_ASSERT_OK(token);
  EXPECT_EQ(*token, "s3cret");
  std::ofstream(path) << "\n";
  EXPECT_EQ(common::ReadTokenFile(path).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::filesystem::remove(path);
  auto missing = common::ReadTokenFile(path);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

TEST(TlsConfigTest, TokensAreNeverSentOrAcceptedInPlaintext) {
  auto client = common::MakeChannelCredentials({}, "token", "job");
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(client.status().message().find("needs TLS"), std::string::npos);
  server::AggregatorServerOptions options;
  options.address = "127.0.0.1:0";
  options.tokens = Tokens();
  auto server = server::AggregatorServer::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument)
      << server.status();
}

TEST(TlsConfigTest, TokenFilesAreParsedStrictly) {
  auto tokens = server::ParseJobTokens(
      "# comment\n\njob-a  secret-a\n*\tany\n  job-b secret-b  \n", "f");
  CO2_ASSERT_OK(tokens);
  EXPECT_EQ(tokens->per_job.at("job-a"), "secret-a");
  EXPECT_EQ(tokens->per_job.at("job-b"), "secret-b");
  EXPECT_EQ(tokens->any_job, "any");
  auto three = server::ParseJobTokens("a b c\n", "tokens.txt");
  EXPECT_EQ(three.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(three.status().message().find("tokens.txt:1"), std::string::npos);
  EXPECT_FALSE(server::ParseJobTokens("a x\na y\n", "f").ok());
  EXPECT_FALSE(server::ParseJobTokens("# nothing\n", "f").ok());
  EXPECT_EQ(server::LoadJobTokensFile("/nonexistent/tokens").status().code(),
            absl::StatusCode::kNotFound);
}

// What an operator sees: the binary refuses plaintext unless told.
TEST(TlsBinaryTest, AggregatorRefusesToStartWithoutTlsUnlessInsecure) {
  std::string output;
  EXPECT_EQ(RunCommand(absl::StrCat(CO2_AGGREGATOR_BINARY, " --port=0"), &output), 2);
  EXPECT_NE(output.find("refusing to serve without TLS"), std::string::npos)
      << output;
  // --insecure starts, says so loudly, and stops cleanly on SIGTERM.
  RunCommand(absl::StrCat("timeout -s TERM 2 ", CO2_AGGREGATOR_BINARY,
                          " --insecure --port=0 --metrics_port=-1"),
             &output);
  const size_t insecure = output.find("INSECURE");
  ASSERT_NE(insecure, std::string::npos) << output;
  const size_t line = output.rfind('\n', insecure);
  EXPECT_EQ(output[line == std::string::npos ? 0 : line + 1], 'W')
      << "not logged as a warning:\n" << output;
  EXPECT_EQ(RunCommand(absl::StrCat(CO2_AGGREGATOR_BINARY,
                             " --port=0 --metrics_port=-1 --tls_cert=/nonexistent/c.pem "
                             "--tls_key=/nonexistent/c.key"),
                &output),
            1);
  EXPECT_NE(output.find("/nonexistent/c.pem"), std::string::npos) << output;
  EXPECT_EQ(RunCommand(absl::StrCat(CO2_AGGREGATOR_BINARY,
                             " --port=0 --insecure --token=x"),
                &output),
            2);
}

}  // namespace
}  // namespace co2
