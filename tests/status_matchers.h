// CO2_ASSERT_OK / CO2_EXPECT_OK: a status-returning call succeeded, and if
// not, the failure names the code and message (where ASSERT_TRUE(s.ok())
// says only "false"). Works for absl::Status, absl::StatusOr<T> and
// grpc::Status; the expression is evaluated once, and more context may be
// streamed in: CO2_ASSERT_OK(Load(path)) << path;
//
// grpc::Status and protobuf's status are matched by shape, not by name, so
// tests that do not link gRPC can include this header. Header
// only.
#ifndef CO2_TESTS_STATUS_MATCHERS_H_
#define CO2_TESTS_STATUS_MATCHERS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace co2::testing {

// "CODE: message" of each status kind, and whether it is OK.
inline std::string StatusText(const absl::Status& s) { return s.ToString(); }

template <typename T>
std::string StatusText(const absl::StatusOr<T>& s) {
  return s.status().ToString();
}

// grpc::Status: its codes are absl's, number for number.
template <typename S>
auto StatusText(const S& s)
    -> decltype(s.error_code(), s.error_message(), std::string()) {
  return absl::StrCat(
      absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())),
      ": ", s.error_message());
}

// google::protobuf::util::Status (protobuf 3.x's own, from the JSON
// utilities): by shape too, a ToString() and no error_code().
template <typename S>
auto StatusText(const S& s) -> decltype(s.ToString()) {
  return s.ToString();
}

// The predicate-formatter behind the macros: `expr` is the source text.
template <typename S>
::testing::AssertionResult StatusIsOk(const char* expr, const S& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << expr << " is not OK: " << StatusText(s);
}

}  // namespace co2::testing

#define CO2_ASSERT_OK(expr) \
  ASSERT_PRED_FORMAT1(::co2::testing::StatusIsOk, expr)
#define CO2_EXPECT_OK(expr) \
  EXPECT_PRED_FORMAT1(::co2::testing::StatusIsOk, expr)

#endif  // CO2_TESTS_STATUS_MATCHERS_H_
