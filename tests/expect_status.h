// ExpectStatus: a gRPC call ended with `code` and a message containing
// `message_part`, for the tests over real gRPC. Header only.
#ifndef CO2_TESTS_EXPECT_STATUS_H_
#define CO2_TESTS_EXPECT_STATUS_H_

#include <string>

#include "grpcpp/support/status.h"
#include "gtest/gtest.h"

namespace co2::testing {

inline void ExpectStatus(const grpc::Status& s, grpc::StatusCode code,
                         const std::string& message_part) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(message_part), std::string::npos)
      << "message: " << s.error_message() << "\nexpected to contain: "
      << message_part;
}

}  // namespace co2::testing

#endif  // CO2_TESTS_EXPECT_STATUS_H_
