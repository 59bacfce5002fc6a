// GlooGroup / CreateProcessGroup(kGloo): N real processes (fork) per
// test, each one rank, checked against closed-form results. Children report
// through their exit code (0 = pass) and explain failures on stderr; each
// child arms alarm() so that a hang ends as SIGALRM, never as a stuck test.
#include "client/collectives/gloo_group.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/collectives/process_group.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2::client {
namespace {

using ::co2::testing::TempDir;

using ::testing::Each;
using ::testing::Eq;

// Child exit codes.
constexpr int kPass = 0;
constexpr int kCreateFailed = 10;
constexpr int kCallFailed = 11;
constexpr int kWrongValue = 12;
constexpr int kUnexpectedOk = 13;
constexpr int kTooSlow = 14;
constexpr int kWrongCode = 15;

#define CHILD_CHECK(cond, code, ...)                                     \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "[child %d] %s:%d: %s\n", getpid(), __FILE__, \
                   __LINE__, absl::StrCat(__VA_ARGS__).c_str());         \
      return (code);                                                     \
    }                                                                    \
  } while (false)

// Forks one process per rank in `ranks`, runs body(rank) there and returns
// each child's exit code, or 1000 + signal number if it was killed.
std::vector<int> RunRanks(const std::vector<int>& ranks,
                          const std::function<int(int)>& body,
                          absl::Duration watchdog = absl::Seconds(90)) {
  std::vector<pid_t> pids;
  for (int rank : ranks) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(static_cast<unsigned>(absl::ToInt64Seconds(watchdog)));
      _exit(body(rank));
    }
    pids.push_back(pid);
  }
  std::vector<int> results;
  for (pid_t pid : pids) {
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
      results.push_back(-1);
    } else if (WIFEXITED(status)) {
      results.push_back(WEXITSTATUS(status));
    } else {
      results.push_back(1000 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
    }
  }
  return results;
}

std::vector<int> AllRanks(int n) {
  std::vector<int> ranks(n);
  for (int i = 0; i < n; ++i) ranks[i] = i;
  return ranks;
}

GroupOptions MakeOptions(const std::string& dir, int rank, int size,
                         absl::Duration timeout = absl::Seconds(60)) {
  GroupOptions options;
  options.backend = Backend::kGloo;
  options.rank = rank;
  options.size = size;
  options.store_dir = dir;
  options.prefix = "test";
  options.timeout = timeout;
  return options;
}

// Integer-valued pattern, so every sum is exact and the mean has a closed form.
float Pattern(size_t i) { return static_cast<float>(i % 1000); }

// rank k holds k + offset + Pattern(i); the mean is (N-1)/2 + offset + Pattern(i).
int AllReduceAndCheck(ProcessGroup& group, size_t count, float offset) {
  std::vector<float> data(count);
  for (size_t i = 0; i < count; ++i) {
    data[i] = static_cast<float>(group.rank()) + offset + Pattern(i);
  }
  const absl::Status status = group.AllReduceMean(data.data(), count);
  CHILD_CHECK(status.ok(), kCallFailed, "AllReduceMean: ", status.ToString());
  const float base = (group.size() - 1) / 2.0f + offset;
  for (size_t i = 0; i < count; ++i) {
    CHILD_CHECK(data[i] == base + Pattern(i), kWrongValue, "rank ",
                group.rank(), " element ", i, " = ", data[i], ", want ",
                base + Pattern(i));
  }
  return kPass;
}

// Root holds 0.5 * i + 7 + root, others garbage; afterwards all hold root's.
int BroadcastAndCheck(ProcessGroup& group, size_t count, int root) {
  auto root_value = [root](size_t i) {
    return 0.5f * static_cast<float>(i % 100000) + 7.0f + root;
  };
  std::vector<float> data(count, -1.0f - group.rank());
  if (group.rank() == root) {
    for (size_t i = 0; i < count; ++i) data[i] = root_value(i);
  }
  const absl::Status status = group.Broadcast(data.data(), count, root);
  CHILD_CHECK(status.ok(), kCallFailed, "Broadcast: ", status.ToString());
  for (size_t i = 0; i < count; ++i) {
    CHILD_CHECK(data[i] == root_value(i), kWrongValue, "rank ", group.rank(),
                " element ", i, " = ", data[i], ", want ", root_value(i));
  }
  return kPass;
}

class GlooGroupTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()); }
  int n() const { return GetParam(); }
  TempDir dir_;
};

TEST_P(GlooGroupTest, AllReduceMeanIsClosedFormMean) {
  const std::string dir = dir_.path();
  const int n = this->n();
  const std::vector<int> codes = RunRanks(AllRanks(n), [&](int rank) {
    auto group = CreateProcessGroup(MakeOptions(dir, rank, n));
    CHILD_CHECK(group.ok(), kCreateFailed, group.status().ToString());
    CHILD_CHECK((*group)->rank() == rank && (*group)->size() == n,
                kWrongValue, "rank/size mismatch");
    // Several rounds: tags advance in step on every rank.
    for (int round = 0; round < 3; ++round) {
      const int code = AllReduceAndCheck(**group, 1031, 10.0f * round);
      if (code != kPass) return code;
    }
    return kPass;
  });
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

TEST_P(GlooGroupTest, BroadcastFromRootOneCopiesRootData) {
  const std::string dir = dir_.path();
  const int n = this->n();
  const std::vector<int> codes = RunRanks(AllRanks(n), [&](int rank) {
    auto group = CreateProcessGroup(MakeOptions(dir, rank, n));
    CHILD_CHECK(group.ok(), kCreateFailed, group.status().ToString());
    int code = BroadcastAndCheck(**group, 777, /*root=*/1);
    if (code != kPass) return code;
    // Then from the last rank, interleaved with an all-reduce.
    code = AllReduceAndCheck(**group, 64, 0.0f);
    if (code != kPass) return code;
    return BroadcastAndCheck(**group, 5, /*root=*/n - 1);
  });
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

TEST_P(GlooGroupTest, LargeBuffer) {
  const std::string dir = dir_.path();
  const int n = this->n();
  constexpr size_t kCount = (size_t{1} << 20) + 3;  // > 1M floats, odd.
  const std::vector<int> codes = RunRanks(AllRanks(n), [&](int rank) {
    auto group = CreateProcessGroup(MakeOptions(dir, rank, n));
    CHILD_CHECK(group.ok(), kCreateFailed, group.status().ToString());
    const int code = AllReduceAndCheck(**group, kCount, 1.0f);
    if (code != kPass) return code;
    return BroadcastAndCheck(**group, kCount, /*root=*/1);
  });
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

TEST_P(GlooGroupTest, DeadPeerFailsCollectiveWithinTimeout) {
  const std::string dir = dir_.path();
  const int n = this->n();
  const absl::Duration timeout = absl::Seconds(3);
  const absl::Duration slack = absl::Seconds(3);
  const std::vector<int> codes = RunRanks(
      AllRanks(n),
      [&](int rank) {
        auto group = CreateProcessGroup(MakeOptions(dir, rank, n, timeout));
        CHILD_CHECK(group.ok(), kCreateFailed, group.status().ToString());
        // Everyone is connected and healthy: an all-reduce is a barrier
        // (a broadcast is not: a receiver may finish before the others have
        // even connected) ...
        const int code = AllReduceAndCheck(**group, 16, 0.0f);
        if (code != kPass) return code;
        // ... then the last rank dies without joining the all-reduce.
        if (rank == n - 1) _exit(kPass);
        std::vector<float> data(4096, 1.0f);
        const absl::Time start = absl::Now();
        const absl::Status status =
            (*group)->AllReduceMean(data.data(), data.size());
        const absl::Duration elapsed = absl::Now() - start;
        std::fprintf(stderr, "[rank %d] dead peer -> %s after %s\n", rank,
                     status.ToString().c_str(),
                     absl::FormatDuration(elapsed).c_str());
        CHILD_CHECK(!status.ok(), kUnexpectedOk, "all-reduce succeeded");
        CHILD_CHECK(elapsed < timeout + slack, kTooSlow, "took ",
                    absl::FormatDuration(elapsed));
        // The group is broken for good.
        const absl::Status again =
            (*group)->AllReduceMean(data.data(), data.size());
        CHILD_CHECK(absl::IsFailedPrecondition(again), kWrongCode,
                    again.ToString());
        return kPass;
      },
      /*watchdog=*/absl::Seconds(30));
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

TEST_P(GlooGroupTest, StalledPeerFailsCollectiveAtTimeout) {
  const std::string dir = dir_.path();
  const int n = this->n();
  const absl::Duration timeout = absl::Seconds(1);
  const std::vector<int> codes = RunRanks(
      AllRanks(n),
      [&](int rank) {
        auto group = CreateProcessGroup(MakeOptions(dir, rank, n, timeout));
        CHILD_CHECK(group.ok(), kCreateFailed, group.status().ToString());
        const int code = AllReduceAndCheck(**group, 16, 0.0f);
        if (code != kPass) return code;
        // The last rank is alive but never joins the next collective.
        if (rank == n - 1) {
          absl::SleepFor(timeout + absl::Seconds(2));
          return kPass;
        }
        std::vector<float> data(4096, 1.0f);
        const absl::Time start = absl::Now();
        const absl::Status status =
            (*group)->AllReduceMean(data.data(), data.size());
        const absl::Duration elapsed = absl::Now() - start;
        // The first rank to time out closes its sockets, so the others may
        // see UNAVAILABLE instead.
        CHILD_CHECK(absl::IsDeadlineExceeded(status) ||
                        absl::IsUnavailable(status),
                    kWrongCode, status.ToString());
        CHILD_CHECK(elapsed < timeout + absl::Seconds(2), kTooSlow, "took ",
                    absl::FormatDuration(elapsed));
        return kPass;
      },
      /*watchdog=*/absl::Seconds(30));
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

TEST_P(GlooGroupTest, MissingPeerFailsRendezvousWithinTimeout) {
  const std::string dir = dir_.path();
  const int n = this->n();
  const absl::Duration timeout = absl::Seconds(1);
  std::vector<int> present = AllRanks(n);
  present.pop_back();  // The last rank never comes.
  const std::vector<int> codes = RunRanks(
      present,
      [&](int rank) {
        const absl::Time start = absl::Now();
        auto group = CreateProcessGroup(MakeOptions(dir, rank, n, timeout));
        const absl::Duration elapsed = absl::Now() - start;
        CHILD_CHECK(!group.ok(), kUnexpectedOk, "rendezvous succeeded");
        CHILD_CHECK(absl::IsDeadlineExceeded(group.status()), kWrongCode,
                    group.status().ToString());
        CHILD_CHECK(elapsed < timeout + absl::Seconds(2), kTooSlow, "took ",
                    absl::FormatDuration(elapsed));
        return kPass;
      },
      /*watchdog=*/absl::Seconds(30));
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooGroupTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("N", info.param);
                         });

TEST(GlooGroupSingle, OneRankGroupIsIdentityAndChecksRoot) {
  TempDir dir;
  const std::string path = dir.path();
  const std::vector<int> codes = RunRanks({0}, [&](int rank) {
    auto group = GlooGroup::Create(MakeOptions(path, rank, 1));
    CHILD_CHECK(group.ok(), kCreateFailed, group.status().ToString());
    int code = AllReduceAndCheck(**group, 100, 3.0f);
    if (code != kPass) return code;
    code = BroadcastAndCheck(**group, 100, 0);
    if (code != kPass) return code;
    float x = 1.0f;
    const absl::Status bad_root = (*group)->Broadcast(&x, 1, 1);
    CHILD_CHECK(absl::IsInvalidArgument(bad_root), kWrongCode,
                bad_root.ToString());
    const absl::Status negative_root = (*group)->Broadcast(&x, 1, -1);
    CHILD_CHECK(absl::IsInvalidArgument(negative_root), kWrongCode,
                negative_root.ToString());
    const absl::Status null_data = (*group)->AllReduceMean(nullptr, 3);
    CHILD_CHECK(absl::IsInvalidArgument(null_data), kWrongCode,
                null_data.ToString());
    CHILD_CHECK((*group)->AllReduceMean(nullptr, 0).ok(), kCallFailed,
                "empty all-reduce failed");
    return kPass;
  });
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

TEST(GlooGroupSingle, TwoGroupsShareStoreDirUnderDistinctPrefixes) {
  TempDir dir;
  const std::string path = dir.path();
  const std::vector<int> codes = RunRanks(AllRanks(2), [&](int rank) {
    GroupOptions a = MakeOptions(path, rank, 2);
    a.prefix = "grads";
    GroupOptions b = MakeOptions(path, rank, 2);
    b.prefix = "updates";
    auto group_a = CreateProcessGroup(a);
    CHILD_CHECK(group_a.ok(), kCreateFailed, group_a.status().ToString());
    auto group_b = CreateProcessGroup(b);
    CHILD_CHECK(group_b.ok(), kCreateFailed, group_b.status().ToString());
    int code = AllReduceAndCheck(**group_b, 10, 5.0f);
    if (code != kPass) return code;
    return AllReduceAndCheck(**group_a, 10, 2.0f);
  });
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

TEST(GlooGroupSingle, PairsUseTheGivenAddress) {
  TempDir dir;
  const std::string path = dir.path();
  // Another loopback address works; one that is no interface of this host
  // (TEST-NET-1) cannot be bound, so the rendezvous fails.
  std::vector<int> codes = RunRanks(AllRanks(2), [&](int rank) {
    GroupOptions options = MakeOptions(path, rank, 2);
    options.prefix = "other-loopback";
    options.address = "127.0.0.2";
    auto group = CreateProcessGroup(options);
    CHILD_CHECK(group.ok(), kCreateFailed, group.status().ToString());
    return AllReduceAndCheck(**group, 10, 1.0f);
  });
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
  codes = RunRanks(
      AllRanks(2),
      [&](int rank) {
        GroupOptions options = MakeOptions(path, rank, 2, absl::Seconds(2));
        options.prefix = "foreign";
        options.address = "192.0.2.1";
        auto group = CreateProcessGroup(options);
        CHILD_CHECK(!group.ok(), kUnexpectedOk, "bound a foreign address");
        return kPass;
      },
      /*watchdog=*/absl::Seconds(30));
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

TEST(GlooGroupOptions, RejectsInvalidOptions) {
  TempDir dir;
  auto expect_invalid = [](GroupOptions options) {
    EXPECT_TRUE(absl::IsInvalidArgument(CreateProcessGroup(options).status()));
    EXPECT_TRUE(absl::IsInvalidArgument(GlooGroup::Create(options).status()));
  };
  GroupOptions options = MakeOptions(dir.path(), 0, 2);
  options.rank = 2;
  expect_invalid(options);
  options = MakeOptions(dir.path(), 0, 2);
  options.rank = -1;
  expect_invalid(options);
  options = MakeOptions(dir.path(), 0, 0);
  expect_invalid(options);
  options = MakeOptions("", 0, 1);
  expect_invalid(options);
  options = MakeOptions(dir.path(), 0, 1);
  options.prefix = "a/b";
  expect_invalid(options);
  options = MakeOptions(dir.path(), 0, 1);
  options.prefix = "";
  expect_invalid(options);
  options = MakeOptions(dir.path(), 0, 1, absl::ZeroDuration());
  expect_invalid(options);
  options = MakeOptions(dir.path(), 0, 1, absl::InfiniteDuration());
  expect_invalid(options);
}

TEST(GlooFileStore, SetThenWaitGetRoundTrips) {
  TempDir dir;
  const GroupOptions options = MakeOptions(dir.path() + "/sub", 0, 1);
  const std::string blob("a\0b\xff", 4);
  absl::StatusOr<std::unique_ptr<Store>> writer = OpenFileStore(options);
  CO2_ASSERT_OK(writer);
  CO2_ASSERT_OK((*writer)->Set("key", blob));
  // Another rank opens the same store.
  absl::StatusOr<std::unique_ptr<Store>> reader = OpenFileStore(options);
  CO2_ASSERT_OK(reader);
  const absl::StatusOr<std::string> got = (*reader)->WaitGet("key");
  CO2_ASSERT_OK(got);
  EXPECT_EQ(*got, blob);
}

TEST(GlooFileStore, WaitGetTimesOutOnMissingKey) {
  TempDir dir;
  const GroupOptions options =
      MakeOptions(dir.path(), 0, 1, absl::Milliseconds(200));
  absl::StatusOr<std::unique_ptr<Store>> store = OpenFileStore(options);
  CO2_ASSERT_OK(store);
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::string> got = (*store)->WaitGet("never");
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
  // gloo's own FileStore would take a whole second here.
  EXPECT_GE(elapsed, absl::Milliseconds(200));
  EXPECT_LT(elapsed, absl::Milliseconds(800));
}

}  // namespace
}  // namespace co2::client
