#include "client/training/torch_status.h"

#include <c10/util/Exception.h>

#include <new>
#include <stdexcept>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace co2::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

template <typename F>
absl::Status Convert(F&& f) {
  try {
    f();
  } catch (...) {
    return TorchExceptionToStatus("doing it");
  }
  return absl::OkStatus();
}

TEST(TorchStatusTest, TorchCheckBecomesInvalidArgumentWithoutBacktrace) {
  const absl::Status status =
      Convert([] { TORCH_CHECK(1 == 2, "shape ", 3, " is wrong"); });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("doing it: "));
  EXPECT_THAT(status.message(), HasSubstr("shape 3 is wrong"));
  // The C++ backtrace (frames listed after "Exception raised from") stays
  // out of the status.
  EXPECT_THAT(status.message(), Not(HasSubstr("Exception raised from")));
}

TEST(TorchStatusTest, IndexErrorIsInvalidArgument) {
  EXPECT_EQ(Convert([] { TORCH_CHECK_INDEX(false, "index 7"); }).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TorchStatusTest, NotImplementedIsUnimplemented) {
  EXPECT_EQ(
      Convert([] { TORCH_CHECK_NOT_IMPLEMENTED(false, "no kernel"); }).code(),
      absl::StatusCode::kUnimplemented);
}

TEST(TorchStatusTest, OtherExceptions) {
  EXPECT_EQ(Convert([] { throw std::bad_alloc(); }).code(),
            absl::StatusCode::kResourceExhausted);
  const absl::Status status = Convert([] { throw std::runtime_error("boom"); });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("boom"));
  EXPECT_EQ(Convert([] { throw 42; }).code(), absl::StatusCode::kInternal);
}

TEST(TorchStatusTest, OutsideACatchIsInternalNotTerminate) {
  EXPECT_EQ(TorchExceptionToStatus("x").code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace co2::client
