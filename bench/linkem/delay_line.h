// DelayLine: the packets a link emulator holds back, each until its due
// time (arrival + the one-way delay), and the random loss that drops some
// on arrival. With one fixed delay the due times run in arrival order, so
// the line is a FIFO and everything due is released at once: one batch
// verdict for the last due packet id (netfilter's NFQUEUE accepts every
// queued packet up to an id, wrap-safe).
//
// Pure logic, no netfilter and no clock: times are nanoseconds passed in
// by the caller (bench/linkem/linkem_main.cc). One thread.
#ifndef CO2_BENCH_LINKEM_DELAY_LINE_H_
#define CO2_BENCH_LINKEM_DELAY_LINE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <random>

#include "absl/status/statusor.h"

namespace co2::bench {

struct DelayLineOptions {
  int64_t delay_ns = 0;  // one way, added to every packet kept
  double loss = 0.0;     // probability that an arriving packet is dropped
  uint64_t seed = 1;     // of the loss draws
};

struct DelayLineStats {
  uint64_t arrived = 0;
  uint64_t dropped = 0;   // by the loss draw
  uint64_t released = 0;  // due and let through
  uint64_t max_held = 0;  // most packets held at once
};

class DelayLine {
 public:
  // INVALID_ARGUMENT for a negative delay or a loss outside [0, 1).
  static absl::StatusOr<DelayLine> Create(const DelayLineOptions& options);

  // Packet `id` arrived at `now_ns`: true if it is held (released later by
  // ReleaseDue), false if the loss draw dropped it.
  bool Arrive(uint32_t id, int64_t now_ns);
  // Removes every packet due by `now_ns` and returns the id of the last of
  // them, or nothing if none is due.
  std::optional<uint32_t> ReleaseDue(int64_t now_ns);
  // When the oldest held packet is due; nothing if none is held.
  std::optional<int64_t> NextDue() const;

  size_t held() const { return held_.size(); }
  const DelayLineStats& stats() const { return stats_; }

 private:
  struct Held {
    uint32_t id;
    int64_t due_ns;
  };
  explicit DelayLine(const DelayLineOptions& options);

  DelayLineOptions options_;
  std::mt19937_64 random_;
  std::bernoulli_distribution drop_;
  std::deque<Held> held_;
  DelayLineStats stats_;
};

}  // namespace co2::bench

#endif  // CO2_BENCH_LINKEM_DELAY_LINE_H_
