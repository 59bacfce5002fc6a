#include "server/storage/write_failure.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "server/storage/durable_file.h"
#include "tests/temp_dir.h"

namespace co2::server {
namespace {

struct ErrnoCase {
  int err;
  WriteFailure failure;
  const char* name;
};

class WriteFailureTest : public ::testing::TestWithParam<ErrnoCase> {};

TEST_P(WriteFailureTest, ErrnoStatusCarriesItsErrnoClass) {
  const ErrnoCase& c = GetParam();
  const absl::Status status = ErrnoStatus("cannot write", "/ckpt/a", c.err);
  EXPECT_EQ(ErrnoOf(status), c.err);
  EXPECT_EQ(WriteFailureOf(status), c.failure) << status;
  EXPECT_EQ(WriteFailureName(WriteFailureOf(status)), c.name);
  EXPECT_EQ(WriteFailureText(status), std::strerror(c.err));
}

INSTANTIATE_TEST_SUITE_P(
    Errnos, WriteFailureTest,
    ::testing::Values(ErrnoCase{ENOSPC, WriteFailure::kNoSpace, "no_space"},
                      ErrnoCase{EDQUOT, WriteFailure::kNoSpace, "no_space"},
                      ErrnoCase{EIO, WriteFailure::kIoError, "io_error"},
                      ErrnoCase{EACCES, WriteFailure::kPermission, "permission"},
                      ErrnoCase{EPERM, WriteFailure::kPermission, "permission"},
                      ErrnoCase{EROFS, WriteFailure::kPermission, "permission"},
                      ErrnoCase{ENOTDIR, WriteFailure::kOther, "other"},
                      ErrnoCase{EBADF, WriteFailure::kOther, "other"}));

TEST(WriteFailureTest, AStatusWithoutErrnoIsOtherAndTellsItsMessage) {
  const absl::Status status = absl::DataLossError("update chunk 3 unreadable");
  EXPECT_EQ(ErrnoOf(status), std::nullopt);
  EXPECT_EQ(WriteFailureOf(status), WriteFailure::kOther);
  EXPECT_EQ(WriteFailureText(status), "update chunk 3 unreadable");
}

TEST(WriteFailureTest, TheStatusCodeAndMessageStayAsErrnoStatusMadeThem) {
  const absl::Status full = ErrnoStatus("cannot write", "/ckpt/a", ENOSPC);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(), "cannot write /ckpt/a: No space left on device");
  EXPECT_EQ(ErrnoStatus("cannot fsync", "/ckpt/a", EIO).code(),
            absl::StatusCode::kUnavailable);
}

TEST(WriteFailureTest, AFailedDirectoryCreationNamesItsErrno) {
  // A file where a parent directory should be: mkdir fails with ENOTDIR.
  const co2::testing::TempDir dir("co2-write-failure");
  const std::string file = dir.Path("file");
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  const absl::Status status = MakeDirectories(file + "/ckpt");
  EXPECT_EQ(ErrnoOf(status), ENOTDIR) << status;
  EXPECT_EQ(WriteFailureText(status), std::strerror(ENOTDIR));
}

}  // namespace
}  // namespace co2::server
