// ReadThread: one thread for the file reads that a gRPC reaction must not do
// (a reaction runs on gRPC's callback threads and never blocks). Tasks run
// in the order they were posted. Thread-safe. The destructor runs the tasks
// already posted, then joins: destroy it only after the server has shut
// down, since a task may hold a stream open until it runs.
#ifndef CO2_SERVER_SERVICE_READ_THREAD_H_
#define CO2_SERVER_SERVICE_READ_THREAD_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace co2::server {

class ReadThread {
 public:
  ReadThread();
  ~ReadThread();

  ReadThread(const ReadThread&) = delete;
  ReadThread& operator=(const ReadThread&) = delete;

  // Queues `task`; it runs on the thread, after every task posted before.
  void Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_READ_THREAD_H_
