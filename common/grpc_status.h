// The one place where gRPC's status model and absl::Status meet: same codes,
// same messages, both directions. Any thread.
#ifndef CO2_COMMON_GRPC_STATUS_H_
#define CO2_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace co2::common {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace co2::common

#endif  // CO2_COMMON_GRPC_STATUS_H_
