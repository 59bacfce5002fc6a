// The plaintext health port answers the standard gRPC health check the way
// Kubernetes' gRPC probe asks it (service "", no TLS, no metadata).
#include "server/service/health_server.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

// grpc.health.v1.Health/Check with an empty HealthCheckRequest (service "")
// through the generic API (Debian ships no generated health stubs). Returns
// the status code and the serialized response.
grpc::Status Check(int port, const std::string& method, std::string* response) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::Slice empty;  // the empty message (a default ByteBuffer is no message)
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer reply;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&context, method, request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&reply, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  EXPECT_TRUE(cq.Next(&tag, &ok));
  EXPECT_TRUE(ok);
  std::vector<grpc::Slice> slices;
  if (status.ok() && reply.Dump(&slices).ok()) {
    for (const auto& s : slices) {
      response->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

constexpr char kCheck[] = "/grpc.health.v1.Health/Check";

TEST(HealthServerTest, ReportsServingOnAPlaintextPort) {
  auto health = HealthServer::Start("127.0.0.1:0");
  CO2_ASSERT_OK(health);
  ASSERT_GT((*health)->port(), 0);
  std::string response;
  grpc::Status status = Check((*health)->port(), kCheck, &response);
  CO2_ASSERT_OK(status);
  // HealthCheckResponse{status: SERVING (1)}: field 1, varint 1.
  EXPECT_EQ(response, std::string("\x08\x01", 2));
}

TEST(HealthServerTest, ServesNothingElse) {
  auto health = HealthServer::Start("127.0.0.1:0");
  CO2_ASSERT_OK(health);
  std::string response;
  grpc::Status status =
      Check((*health)->port(), "/co2.v1.Aggregator/Join", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(HealthServerTest, ABusyPortIsUnavailable) {
  auto first = HealthServer::Start("127.0.0.1:0");
  CO2_ASSERT_OK(first);
  auto second =
      HealthServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace co2::server
