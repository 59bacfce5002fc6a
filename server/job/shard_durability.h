// ShardDurability: what a shard with checkpoints has made durable, and what
// waits for it (docs/reliability.md). JobShard writes the checkpoint and the
// round journal (server/job/round_journal.h); this unit holds the rules
// around those writes:
//  - a checkpoint is due when a closed round's update waits for one, or
//    when state a checkpoint holds changed (membership, the seeded anchor,
//    the job's lifecycle: MarkDirty) and the anchor is whole (no chunk of
//    the open round stepped);
//  - a failed write is retried no sooner than `retry` later, and until then
//    the state stays due;
//  - the open round's chunks are streamed ahead of its close only while
//    the anchor they apply to is in a checkpoint and the round's journal has
//    not failed (then the round's chunks wait for its checkpoint);
//  - callers waiting for durability are told once a checkpoint holds the
//    state as of their call, or that the shard went away first.
// Without checkpoints every state counts as durable at once. Not
// thread-safe: a unit under the shard's mutex, as the others.
#ifndef CO2_SERVER_JOB_SHARD_DURABILITY_H_
#define CO2_SERVER_JOB_SHARD_DURABILITY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace co2::server {

class ShardDurability {
 public:
  using Waiter = std::function<void(absl::Status)>;

  ShardDurability(bool checkpoints, absl::Duration retry)
      : checkpoints_(checkpoints), retry_(retry) {}

  bool checkpoints() const { return checkpoints_; }

  // State a checkpoint holds changed.
  void MarkDirty() { dirty_ = true; }
  // The anchor was seeded or re-seeded: nothing durable holds it yet.
  void AnchorReplaced();
  // A checkpoint holds the anchor the open round started from (a restore).
  void AnchorRestored() { anchor_durable_ = true; }
  // Whether nothing is left to write (always without checkpoints).
  bool Clean(bool update_waits) const {
    return !checkpoints() || (!dirty_ && !update_waits);
  }

  // Calls `done` once a checkpoint holds the state as of now (OK at once,
  // without checkpoints, and then returns nullopt); otherwise it is kept
  // and handed back by Written or Abandon.
  std::optional<Waiter> Wait(Waiter done);

  // Whether a checkpoint should be written now: a closed round's update
  // waits (`update_waits`), or the state changed and the anchor is whole
  // (`anchor_whole`); never before a failed write's retry time.
  bool Due(bool update_waits, bool anchor_whole, absl::Time now) const;
  // A write begins with the state as of now: a later change makes it due
  // again.
  void BeginWrite() { dirty_ = false; }
  // The write failed: the state stays due, retried from now + retry.
  void WriteFailed(absl::Time now);
  // The write succeeded: the anchor is durable; returns the waiters to tell.
  std::vector<Waiter> Written();
  // When Poll has a retry to make while an update waits (InfiniteFuture if
  // none is scheduled).
  absl::Time RetryAt(bool update_waits) const {
    return update_waits ? retry_at_ : absl::InfiniteFuture();
  }

  // Whether chunks of `open_round` may be stepped and sent ahead of its
  // close (always without checkpoints).
  bool MayStream(uint64_t open_round) const;
  // Appending chunks of `round` to the journal failed: its chunks wait for
  // its checkpoint.
  void JournalFailed(uint64_t round) { unjournaled_round_ = round; }

  // The waiters, for a shard going away (to be told UNAVAILABLE).
  std::vector<Waiter> Abandon();

 private:
  const bool checkpoints_;
  const absl::Duration retry_;
  bool dirty_ = false;
  bool anchor_durable_ = false;
  absl::Time retry_at_ = absl::InfinitePast();
  std::optional<uint64_t> unjournaled_round_;
  std::vector<Waiter> waiters_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_SHARD_DURABILITY_H_
