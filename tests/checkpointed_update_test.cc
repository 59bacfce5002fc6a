#include "server/storage/checkpointed_update.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/stored_chunks.h"
#include "tests/temp_dir.h"

namespace co2::server {
namespace {

TEST(CheckpointedUpdateTest, ReadsEachChunkAtItsOffset) {
  auto stored = StoreChunks({"first", std::string(70000, 'x'), "", "last"});
  ASSERT_NE(stored, nullptr);
  ASSERT_EQ(stored->num_chunks(), 4u);
  EXPECT_EQ(stored->chunk_bytes(1), 70000u);
  std::string out = "stale contents";
  CO2_ASSERT_OK(stored->Read(0, &out));
  EXPECT_EQ(out, "first");
  CO2_ASSERT_OK(stored->Read(1, &out));
  EXPECT_EQ(out, std::string(70000, 'x'));
  CO2_ASSERT_OK(stored->Read(2, &out));
  EXPECT_EQ(out, "");
  CO2_ASSERT_OK(stored->Read(3, &out));
  EXPECT_EQ(out, "last");
}

TEST(CheckpointedUpdateTest, OutlivesTheFileBeingReplacedByTheNextCheckpoint) {
  std::string path;
  auto stored = StoreChunks({"round 4's update"}, &path, /*keep_file=*/true);
  ASSERT_NE(stored, nullptr);
  const std::string next = path + ".next";
  { std::ofstream(next) << "round 5's checkpoint, longer than round 4's"; }
  ASSERT_EQ(std::rename(next.c_str(), path.c_str()), 0);
  std::string out;
  CO2_ASSERT_OK(stored->Read(0, &out));
  EXPECT_EQ(out, "round 4's update");
  ::unlink(path.c_str());
}

TEST(CheckpointedUpdateTest, ATruncatedFileIsDataLossNamingItAndTheChunk) {
  std::string path;
  auto stored = StoreChunks({"chunk zero", "chunk one"}, &path, true);
  ASSERT_NE(stored, nullptr);
  ASSERT_EQ(::truncate(path.c_str(), sizeof(kStoredPrefix) - 1 + 12), 0);
  std::string out;
  CO2_EXPECT_OK(stored->Read(0, &out));
  const absl::Status s = stored->Read(1, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_NE(s.message().find("chunk 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("after 2 of 9 bytes"), std::string::npos) << s;
  ::unlink(path.c_str());
}

TEST(CheckpointedUpdateTest, AReadErrorIsUnavailableWithTheErrnoText) {
  // A descriptor that cannot be read: a directory's.
  const co2::testing::TempDir dir("co2-checkpointed-update");
  const int fd = ::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  CheckpointedUpdate stored(fd, dir.path(), 0, {16});
  std::string out;
  const absl::Status s = stored.Read(0, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("Is a directory"), std::string::npos) << s;
}

}  // namespace
}  // namespace co2::server
