#include "server/job/round_journal.h"

#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2::server {
namespace {

using ::co2::testing::TempDir;

// A chunk's state and update, with values that tell chunks apart.
struct Chunk {
  Chunk(uint32_t index, size_t n, bool with_momentum) : index(index) {
    for (size_t i = 0; i < n; ++i) {
      anchor.push_back(0.5f * static_cast<float>(index) + 1e-3f * i);
      if (with_momentum) momentum.push_back(-static_cast<float>(i));
    }
    update.assign(n * sizeof(float), static_cast<char>('a' + index));
  }
  JournalChunk View() const {
    return JournalChunk{index,  2,        {{"w0", 1.5}, {"w1", 0}},
                        anchor, momentum, update};
  }
  void ExpectLoaded(const LoadedJournalChunk& loaded, uint64_t round) const {
    EXPECT_EQ(loaded.header.round(), round);
    EXPECT_EQ(loaded.header.chunk_index(), index);
    EXPECT_EQ(loaded.header.contributors(), 2u);
    ASSERT_EQ(loaded.header.senders_size(), 2);
    EXPECT_EQ(loaded.header.senders(0).worker_id(), "w0");
    EXPECT_EQ(loaded.header.senders(0).contribution_weight(), 1.5);
    EXPECT_EQ(loaded.header.senders(1).worker_id(), "w1");
    ASSERT_EQ(loaded.anchor.size(), anchor.size());
    EXPECT_EQ(std::memcmp(loaded.anchor.data(), anchor.data(),
                          anchor.size() * sizeof(float)),
              0);
    EXPECT_EQ(loaded.momentum, momentum);
    EXPECT_EQ(loaded.update, update);
  }

  uint32_t index;
  std::vector<float> anchor, momentum;
  std::string update;
};

off_t FileSize(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  return static_cast<off_t>(in.tellg());
}

TEST(RoundJournalTest, AppendedChunksLoadBackBitForBit) {
  const TempDir temp_dir("co2-journal");
  const std::string path = temp_dir.path() + "/job.journal";
  const Chunk a(0, 1000, true), b(3, 500, true), c(1, 1000, true);
  RoundJournal journal(path);
  CO2_ASSERT_OK(journal.Append(5, {a.View(), b.View()}));
  CO2_ASSERT_OK(journal.Append(5, {c.View()}));
  auto loaded = RoundJournal::Load(path, 5);
  CO2_ASSERT_OK(loaded);
  ASSERT_EQ(loaded->size(), 3u);
  a.ExpectLoaded((*loaded)[0], 5);
  b.ExpectLoaded((*loaded)[1], 5);
  c.ExpectLoaded((*loaded)[2], 5);
  // Another round's restore takes none of them.
  auto other = RoundJournal::Load(path, 6);
  CO2_ASSERT_OK(other);
  EXPECT_TRUE(other->empty());
  // No file: nothing to restore.
  auto none = RoundJournal::Load(path + ".missing", 5);
  CO2_ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

TEST(RoundJournalTest, ARecordCutShortOrCorruptedEndsTheJournal) {
  const TempDir temp_dir("co2-journal");
  const std::string path = temp_dir.path() + "/job.journal";
  const Chunk a(0, 1000, false), b(1, 1000, false);
  {
    RoundJournal journal(path);
    CO2_ASSERT_OK(journal.Append(2, {a.View(), b.View()}));
  }
  const off_t whole = FileSize(path);
  ASSERT_EQ(truncate(path.c_str(), whole - 3), 0);  // a crash mid-write
  auto loaded = RoundJournal::Load(path, 2);
  CO2_ASSERT_OK(loaded);
  ASSERT_EQ(loaded->size(), 1u);
  a.ExpectLoaded((*loaded)[0], 2);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');  // inside a's anchor
  }
  loaded = RoundJournal::Load(path, 2);
  CO2_ASSERT_OK(loaded);
  EXPECT_TRUE(loaded->empty()) << "a record failing its CRC is not used";
}

TEST(RoundJournalTest, ANewRoundEmptiesItAndAClearRemovesIt) {
  const TempDir temp_dir("co2-journal");
  const std::string path = temp_dir.path() + "/job.journal";
  const Chunk a(0, 100, false), b(1, 100, false);
  RoundJournal journal(path);
  CO2_ASSERT_OK(journal.Append(1, {a.View()}));
  CO2_ASSERT_OK(journal.Append(2, {b.View()}));
  EXPECT_TRUE(RoundJournal::Load(path, 1)->empty());
  ASSERT_EQ(RoundJournal::Load(path, 2)->size(), 1u);
  b.ExpectLoaded((*RoundJournal::Load(path, 2))[0], 2);
  CO2_ASSERT_OK(journal.Clear());
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "no empty file is left behind";
  CO2_ASSERT_OK(journal.Append(2, {a.View()}));
  ASSERT_EQ(RoundJournal::Load(path, 2)->size(), 1u);

  // A later process (a restarted shard) removes what an earlier one left
  // by Clear, or empties it by its first Append.
  RoundJournal restarted(path);
  CO2_ASSERT_OK(restarted.Clear());
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  RoundJournal earlier(path);
  CO2_ASSERT_OK(earlier.Append(3, {a.View()}));
  RoundJournal again(path);
  CO2_ASSERT_OK(again.Append(3, {b.View()}));
  ASSERT_EQ(RoundJournal::Load(path, 3)->size(), 1u);
  b.ExpectLoaded((*RoundJournal::Load(path, 3))[0], 3);
}

TEST(RoundJournalTest, AFailedAppendSaysWhichFileAndWhy) {
  const TempDir temp_dir("co2-journal");
  const std::string dir = temp_dir.path();
  RoundJournal nowhere(dir + "/no-such-directory/job.journal");
  const absl::Status missing = nowhere.Append(0, {Chunk(0, 10, false).View()});
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(missing.message(), "no-such-directory/job"))
      << missing;

  // A full disk: RESOURCE_EXHAUSTED, and what was synced before still loads.
  const std::string small = dir + "/small";
  ASSERT_EQ(mkdir(small.c_str(), 0700), 0);
  if (mount("tmpfs", small.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root)";
  }
  const std::string path = small + "/job.journal";
  const Chunk fits(0, 1000, false), too_big(1, 100000, false);
  RoundJournal journal(path);
  CO2_ASSERT_OK(journal.Append(4, {fits.View()}));
  const absl::Status full = journal.Append(4, {too_big.View()});
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_TRUE(absl::StrContains(full.message(), path)) << full;
  auto loaded = RoundJournal::Load(path, 4);
  CO2_ASSERT_OK(loaded);
  ASSERT_EQ(loaded->size(), 1u);
  fits.ExpectLoaded((*loaded)[0], 4);
  umount(small.c_str());
}

}  // namespace
}  // namespace co2::server
