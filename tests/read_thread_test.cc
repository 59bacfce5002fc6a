#include "server/service/read_thread.h"

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace co2::server {
namespace {

TEST(ReadThreadTest, RunsTasksInOrderOffTheCallersThread) {
  absl::Mutex mu;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  absl::Notification done;
  {
    ReadThread reads;
    for (int i = 0; i < 50; ++i) {
      reads.Post([&, i] {
        absl::MutexLock lock(&mu);
        order.push_back(i);
        threads.push_back(std::this_thread::get_id());
      });
    }
    reads.Post([&] { done.Notify(); });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  absl::MutexLock lock(&mu);
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
  for (const std::thread::id& id : threads) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, threads.front());
  }
}

TEST(ReadThreadTest, TheDestructorRunsWhatIsQueued) {
  absl::Notification release;
  int ran = 0;
  {
    ReadThread reads;
    // The first task holds the thread until all are queued.
    reads.Post(
        [&] { release.WaitForNotificationWithTimeout(absl::Seconds(30)); });
    for (int i = 0; i < 10; ++i) reads.Post([&] { ++ran; });
    release.Notify();
  }
  EXPECT_EQ(ran, 10);
}

}  // namespace
}  // namespace co2::server
