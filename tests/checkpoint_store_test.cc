#include "server/storage/checkpoint_store.h"

#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/job_config.h"
#include "gtest/gtest.h"
#include "server/storage/write_failure.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2::server {
namespace {

using ::co2::testing::TempDir;

struct Fixture {
  v1::ShardCheckpointHeader header;
  std::vector<float> anchor, momentum;
  std::vector<std::string> update;
  std::optional<KeptUpdate> kept;  // `update` as a shard keeps it

  Fixture() {
    header.set_job("job/with spaces");
    header.set_shard_index(1);
    *header.mutable_config() = common::DefaultJobConfig(70000, 2);
    header.set_range_begin(65536);
    header.set_range_end(70000);
    header.set_rounds_closed(7);
    header.set_quorum_misses(2);
    header.set_update_contributors(3);
    for (size_t j = 0; j < 70000 - 65536; ++j) {
      anchor.push_back(j * 0.5f);
      momentum.push_back(-1.0f * j);
    }
    SetUpdate({std::string(1000, 'u'), std::string(24, 'v')});
  }

  void SetUpdate(std::vector<std::string> chunks) {
    update = std::move(chunks);
    auto messages = std::make_shared<UpdateChunks>();
    for (const std::string& payload : update) {
      auto message = std::make_shared<v1::OuterUpdate>();
      message->set_round(6);
      message->set_payload(payload);
      messages->push_back(std::move(message));
    }
    kept.emplace(std::move(messages));
  }

  CheckpointView View() const {
    CheckpointView view;
    view.header = &header;
    view.anchor = anchor;
    view.momentum = momentum;
    view.update = &*kept;
    return view;
  }
};

TEST(CheckpointStoreTest, RoundTripsEveryField) {
  const TempDir temp_dir("co2-ckpt");
  CheckpointStore store(temp_dir.path());
  Fixture f;
  CO2_ASSERT_OK(store.Write(f.View()));
  std::vector<UnusableCheckpoint> errors;
  std::vector<LoadedCheckpoint> all = store.LoadAll(1, 2, &errors);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_TRUE(errors.empty());
  const LoadedCheckpoint& c = all[0];
  EXPECT_EQ(c.header.job(), "job/with spaces");
  EXPECT_EQ(c.header.rounds_closed(), 7u);
  EXPECT_EQ(c.header.quorum_misses(), 2u);
  EXPECT_EQ(c.anchor, f.anchor);
  EXPECT_EQ(c.momentum, f.momentum);
  EXPECT_EQ(c.update_chunks, f.update);
  // Another shard's files are not picked up.
  EXPECT_TRUE(store.LoadAll(0, 2, &errors).empty());
}

TEST(CheckpointStoreTest, RewriteReplacesAtomically) {
  const TempDir temp_dir("co2-ckpt");
  CheckpointStore store(temp_dir.path());
  Fixture f;
  CO2_ASSERT_OK(store.Write(f.View()));
  f.header.set_rounds_closed(8);
  f.anchor[0] = 42;
  CO2_ASSERT_OK(store.Write(f.View()));
  auto loaded = CheckpointStore::Load(store.PathFor(f.header.job(), 1, 2));
  CO2_ASSERT_OK(loaded);
  EXPECT_EQ(loaded->header.rounds_closed(), 8u);
  EXPECT_EQ(loaded->anchor[0], 42.0f);
  EXPECT_NE(access((store.PathFor(f.header.job(), 1, 2) + ".tmp").c_str(), F_OK), 0)
      << "temporary file left behind";
}

TEST(CheckpointStoreTest, WriteReturnsTheUpdateReadableAfterTheFileIsReplaced) {
  const TempDir temp_dir("co2-ckpt");
  CheckpointStore store(temp_dir.path());
  Fixture f;
  auto stored = store.Write(f.View());
  CO2_ASSERT_OK(stored);
  ASSERT_NE(*stored, nullptr);
  f.header.set_rounds_closed(8);
  f.SetUpdate({std::string(1000, 'n'), std::string(24, 'w')});
  auto next = store.Write(f.View());
  CO2_ASSERT_OK(next);
  ASSERT_EQ((*stored)->num_chunks(), 2u);
  std::string chunk;
  CO2_ASSERT_OK((*stored)->Read(1, &chunk));
  EXPECT_EQ(chunk, std::string(24, 'v')) << "the replaced file's update";
  CO2_ASSERT_OK((*next)->Read(0, &chunk));
  EXPECT_EQ(chunk, std::string(1000, 'n'));
}

TEST(CheckpointStoreTest, AnUpdateKeptInAnEarlierCheckpointIsWrittenAgain) {
  const TempDir temp_dir("co2-ckpt");
  CheckpointStore store(temp_dir.path());
  Fixture f;
  auto stored = store.Write(f.View());
  CO2_ASSERT_OK(stored);
  f.kept->Store(*stored);         // as the shard does once the update is sent
  f.header.set_quorum_misses(3);  // membership changed: written again
  auto again = store.Write(f.View());
  CO2_ASSERT_OK(again);
  auto loaded = CheckpointStore::Load(store.PathFor(f.header.job(), 1, 2));
  CO2_ASSERT_OK(loaded);
  EXPECT_EQ(loaded->header.quorum_misses(), 3u);
  EXPECT_EQ(loaded->update_chunks, f.update);
}

TEST(CheckpointStoreTest, WithoutAnUpdateThereIsNothingToReadBack) {
  const TempDir temp_dir("co2-ckpt");
  CheckpointStore store(temp_dir.path());
  Fixture f;
  CheckpointView view = f.View();
  view.update = nullptr;
  auto stored = store.Write(view);
  CO2_ASSERT_OK(stored);
  EXPECT_EQ(*stored, nullptr);
  auto loaded = CheckpointStore::Load(store.PathFor(f.header.job(), 1, 2));
  CO2_ASSERT_OK(loaded);
  EXPECT_TRUE(loaded->update_chunks.empty());
}

class CorruptionTest : public ::testing::TestWithParam<int> {};

TEST_P(CorruptionTest, IsDetectedAsDataLoss) {
  const TempDir temp_dir("co2-ckpt");
  CheckpointStore store(temp_dir.path());
  Fixture f;
  CO2_ASSERT_OK(store.Write(f.View()));
  const std::string path = store.PathFor(f.header.job(), 1, 2);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  switch (GetParam()) {
    case 0:  // a flipped bit in the anchor
      bytes[bytes.size() / 2] ^= 0x10;
      break;
    case 1:  // torn write: the tail is missing
      bytes.resize(bytes.size() - 100);
      break;
    case 2:  // not a checkpoint at all
      bytes = "hello";
      break;
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  absl::StatusOr<LoadedCheckpoint> loaded = CheckpointStore::Load(path);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  EXPECT_NE(loaded.status().message().find(path), std::string::npos);
  std::vector<UnusableCheckpoint> errors;
  EXPECT_TRUE(store.LoadAll(1, 2, &errors).empty());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].error.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(errors[0].path, path);
  // Set aside: kept with its bytes, and no longer loaded.
  absl::StatusOr<std::string> aside = CheckpointStore::SetAside(path);
  CO2_ASSERT_OK(aside);
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  std::ifstream kept(*aside, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), bytes);
  errors.clear();
  EXPECT_TRUE(store.LoadAll(1, 2, &errors).empty());
  EXPECT_TRUE(errors.empty());
}

INSTANTIATE_TEST_SUITE_P(Kinds, CorruptionTest, ::testing::Values(0, 1, 2));

TEST(CheckpointStoreTest, CreatesTheDirectoryAndItsMissingParents) {
  const TempDir temp_dir("co2-ckpt");
  const std::string dir = temp_dir.path() + "/volume/co2/checkpoints";
  CheckpointStore store(dir);
  Fixture f;
  CO2_ASSERT_OK(store.Write(f.View()));
  CO2_EXPECT_OK(CheckpointStore::Load(store.PathFor(f.header.job(), 1, 2)));
}

TEST(CheckpointStoreTest, UnwritableDirectoryIsAnErrorNamingThePath) {
  const TempDir temp_dir("co2-ckpt");
  const std::string dir = temp_dir.path() + "/not-a-dir";
  { std::ofstream(dir) << "x"; }  // a file where the directory should be
  CheckpointStore store(dir);
  Fixture f;
  const absl::Status s = store.Write(f.View()).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir), std::string::npos) << s;
}

TEST(CheckpointStoreTest, FullDiskIsResourceExhaustedAndKeepsTheOldFile) {
  const TempDir temp_dir("co2-ckpt");
  const std::string dir = temp_dir.path();
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=16k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root)";
  }
  CheckpointStore store(dir);
  Fixture small;
  small.anchor.resize(1000);
  small.momentum.resize(1000);
  small.header.set_range_end(small.header.range_begin() + 1000);
  CO2_ASSERT_OK(store.Write(small.View()));
  Fixture big;  // ~37 KB: more than the 16 KiB disk holds
  const absl::Status s = store.Write(big.View()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(WriteFailureOf(s), WriteFailure::kNoSpace) << s;
  auto kept = CheckpointStore::Load(store.PathFor(small.header.job(), 1, 2));
  CO2_EXPECT_OK(kept);
  umount(dir.c_str());
}

}  // namespace
}  // namespace co2::server
