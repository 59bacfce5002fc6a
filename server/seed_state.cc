#include "server/seed_state.h"

#include "absl/strings/str_cat.h"

namespace co2::server {

void SeedState::StartReseed(const std::string& worker) {
  seeder_ = worker;
  reseeding_ = true;
  seeded_chunks_ = 0;
}

bool SeedState::OfferSeed(const std::string& worker) {
  if (!seeder_.empty() && seeder_ != worker) return false;
  seeder_ = worker;
  seeded_chunks_ = 0;
  return true;
}

void SeedState::Forget(const std::string& worker) {
  if (seeder_ == worker) seeder_.clear();
}

absl::StatusOr<bool> SeedState::Accept(const std::string& worker,
                                       uint32_t chunk_index,
                                       uint64_t anchor_round,
                                       uint32_t num_chunks) {
  if (seeder_ != worker) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker \"", worker, "\" was not asked to seed (seeder is \"",
        seeder_, "\")"));
  }
  if (chunk_index != seeded_chunks_) {
    return absl::InvalidArgumentError(
        absl::StrCat("seed chunk_index ", chunk_index, " out of order: expected ",
                     seeded_chunks_));
  }
  if (!reseeding_ && anchor_round != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a seed is the anchor of round 0, got anchor_round ", anchor_round));
  }
  if (reseeding_ && chunk_index == 0) reseed_anchor_round_ = anchor_round;
  if (reseeding_ && anchor_round != reseed_anchor_round_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "re-seed chunk ", chunk_index, " has anchor_round ", anchor_round,
        ", chunk 0 had ", reseed_anchor_round_));
  }
  return ++seeded_chunks_ == num_chunks;
}

}  // namespace co2::server
