// SeedState: who writes the anchor into a shard that has none, and in what
// order. In a fresh job the first worker to join seeds A_0 (round 0); a
// shard that lost the state of a running job is re-seeded instead by a
// worker that was training, with its own anchor, whose round every chunk
// must agree on; it replaces a fresh seeder that has not finished. Chunks
// come in order, from the chosen worker only. A seed is all or nothing: chunk
// 0 starts it over, and a seed stream that ends before its last chunk
// (Abandon) leaves nothing counted, so the seeder's retry starts afresh.
//
// It does not hold the anchor, nor know whether it is complete: the owner
// asks it only while the anchor is not ready. Not thread-safe: the owner
// serialises calls (server::JobShard holds a mutex).
#ifndef CO2_SERVER_JOB_SEED_STATE_H_
#define CO2_SERVER_JOB_SEED_STATE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace co2::server {

class SeedState {
 public:
  // The worker asked to seed; empty if none.
  const std::string& seeder() const { return seeder_; }
  // The seed in progress is a re-seed.
  bool reseeding() const { return reseeding_; }
  // The round of the re-seeded anchor (from its first chunk).
  uint64_t reseed_anchor_round() const { return reseed_anchor_round_; }

  // Another worker than `worker` is re-seeding the lost state.
  bool ReseedingByOther(const std::string& worker) const {
    return reseeding_ && !seeder_.empty() && seeder_ != worker;
  }
  // `worker`, which was training, re-seeds the lost state from chunk 0.
  void StartReseed(const std::string& worker);
  // `worker` seeds A_0 from chunk 0 unless another worker was asked to;
  // true if it seeds.
  bool OfferSeed(const std::string& worker);
  // `worker` is gone: if it was seeding, the next worker to join seeds.
  void Forget(const std::string& worker);

  // Counts chunk `chunk_index` of `worker`'s seed, the anchor of
  // `anchor_round`; true if it was the last of `num_chunks`. `attempt`
  // names the seed stream: 0 before its first chunk, then the attempt its
  // chunk 0 started (set here). Chunk 0 of a new stream starts the seed
  // over, discarding what an unfinished one counted. nullptr: the chunk
  // continues whatever seed is in progress (chunk 0 starts one over).
  // FAILED_PRECONDITION for a worker that was not asked to seed;
  // INVALID_ARGUMENT for a chunk out of order, a seed whose round is not 0,
  // or a re-seed chunk whose round differs from chunk 0's; ABORTED for a
  // stream whose seed was started over by another (or by the seeder's new
  // Join). Nothing is counted on error.
  absl::StatusOr<bool> Accept(const std::string& worker, uint32_t chunk_index,
                              uint64_t anchor_round, uint32_t num_chunks,
                              uint64_t* attempt = nullptr);
  // The seed stream of `attempt` ended before its last chunk: if its seed is
  // the one in progress, nothing of it counts any more.
  void Abandon(uint64_t attempt);
  // The re-seed is complete.
  void FinishReseed() { reseeding_ = false; }

 private:
  std::string seeder_;
  uint32_t seeded_chunks_ = 0;
  uint64_t attempt_ = 0;        // the seed in progress; 0: none
  uint64_t last_attempt_ = 0;   // attempts are numbered from 1
  bool reseeding_ = false;
  uint64_t reseed_anchor_round_ = 0;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_SEED_STATE_H_
