// UpdateCache: the encoded updates of one (job, shard)'s last closed rounds,
// oldest first, in two stages: unpublished (the round closed but its
// checkpoint is not durable yet, so nobody was sent it) and published (sent,
// and kept for workers that reconnect and ask for the rounds they missed).
// A reconnecting worker has contributed at most max_staleness rounds past
// the last update it applied, so it misses at most the last replay_rounds =
// max_staleness + 1 closed rounds: the cache keeps that many rounds of
// updates, published and unpublished together, dropping the oldest
// published one first. An unpublished update is never dropped.
//
// An unpublished update is in memory. Once published, the update a durable
// checkpoint holds is kept in that checkpoint instead (KeptUpdate::Store):
// the streams sending it hold its messages until they are sent, and the
// cache only holds the file. Without checkpoints updates stay in memory.
//
// A shard may also stream the chunks of the open round's update that are
// complete before the round closes (AddStreamed; with checkpoints, once each
// is in the round journal): those are sent as they are made, kept for a
// stream that starts meanwhile (Streamed, then StreamedUnpublishedSince once
// the round closed), and not sent again when their round's update is
// published.
//
// Not thread-safe: the owner serialises calls (server::JobShard holds a
// mutex). The updates themselves are immutable and shared.
#ifndef CO2_SERVER_JOB_UPDATE_CACHE_H_
#define CO2_SERVER_JOB_UPDATE_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "server/storage/checkpointed_update.h"
#include "server/storage/kept_update.h"
#include "server/storage/update_chunks.h"

namespace co2::server {

class UpdateCache {
 public:
  // `replay_rounds` (max_staleness + 1) is at least 1.
  explicit UpdateCache(size_t replay_rounds) : replay_rounds_(replay_rounds) {}
  UpdateCache(const UpdateCache&) = delete;
  UpdateCache& operator=(const UpdateCache&) = delete;

  // Before a round's update is built: drops the oldest published updates
  // until the new one fits in replay_rounds, so no more than that many exist
  // at any time.
  void MakeRoomForNext() { Trim(replay_rounds_ - 1); }
  // A chunk of the open round's update, sent ahead of the round's close.
  void AddStreamed(std::shared_ptr<const v1::OuterUpdate> chunk);
  // The chunks sent ahead for the round that has not closed yet, in the
  // order they were made; empty if none.
  const UpdateChunks& Streamed() const { return streamed_; }
  // The update of the round that just closed, held until Publish. The
  // chunks of it that were streamed are not sent again.
  void AddUnpublished(std::shared_ptr<const UpdateChunks> update);
  // The update of a restored shard's last closed round: already published.
  void AddPublished(std::shared_ptr<const UpdateChunks> update);
  // Their checkpoint is durable: the unpublished updates become published
  // (the oldest beyond replay_rounds dropped). Returns them, oldest first,
  // for the streams: each one's chunks that were not streamed (an update
  // streamed whole is left out). `stored`, when not null, is the last update as
  // that checkpoint wrote it: from now on the cache keeps it there.
  std::vector<std::shared_ptr<const UpdateChunks>> Publish(
      std::shared_ptr<const CheckpointedUpdate> stored);

  bool has_unpublished() const { return !unpublished_.empty(); }
  size_t num_unpublished() const { return unpublished_.size(); }
  // The update of the last closed round, published or not; nullopt if none.
  // A copy, so that it outlives MakeRoomForNext while it is the next gap.
  std::optional<KeptUpdate> Last() const;
  // Every update held, published or not, oldest first (the last is Last()).
  std::vector<KeptUpdate> All() const;
  // The round of the oldest update held; nullopt if none.
  std::optional<uint64_t> OldestRound() const;
  // The published updates of rounds >= from_round, oldest first.
  std::vector<KeptUpdate> PublishedSince(uint64_t from_round) const;
  // The chunks of the unpublished updates of rounds >= from_round that were
  // streamed before their round closed, oldest round first: they went out
  // already, so Publish does not send them again, and a stream that starts
  // meanwhile needs them from here.
  std::vector<std::shared_ptr<const UpdateChunks>> StreamedUnpublishedSince(
      uint64_t from_round) const;

 private:
  // Drops the oldest published updates until `keep` rounds of updates
  // (published or not) are left.
  void Trim(size_t keep);

  // An update waiting for Publish: its chunks streamed before its round
  // closed, and those the streams still need.
  struct Unpublished {
    KeptUpdate update;
    std::shared_ptr<const UpdateChunks> streamed;
    std::shared_ptr<const UpdateChunks> unsent;
  };

  const size_t replay_rounds_;
  std::vector<KeptUpdate> published_;
  std::vector<Unpublished> unpublished_;
  UpdateChunks streamed_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_UPDATE_CACHE_H_
