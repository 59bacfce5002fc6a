#include "server/job/seed_state.h"

#include "absl/strings/str_cat.h"

namespace co2::server {

void SeedState::StartReseed(const std::string& worker) {
  seeder_ = worker;
  reseeding_ = true;
  seeded_chunks_ = 0;
  attempt_ = 0;
}

bool SeedState::OfferSeed(const std::string& worker) {
  if (!seeder_.empty() && seeder_ != worker) return false;
  seeder_ = worker;
  seeded_chunks_ = 0;
  attempt_ = 0;
  return true;
}

void SeedState::Forget(const std::string& worker) {
  if (seeder_ == worker) seeder_.clear();
}

void SeedState::Abandon(uint64_t attempt) {
  if (attempt == 0 || attempt != attempt_) return;
  attempt_ = 0;
  seeded_chunks_ = 0;
}

absl::StatusOr<bool> SeedState::Accept(const std::string& worker,
                                       uint32_t chunk_index,
                                       uint64_t anchor_round,
                                       uint32_t num_chunks, uint64_t* attempt) {
  if (seeder_ != worker) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker \"", worker,
                     "\" was not asked to seed (seeder is \"", seeder_, "\")"));
  }
  const bool stream_started = attempt != nullptr && *attempt != 0;
  const bool fresh_stream = attempt != nullptr && *attempt == 0;
  const bool starts = chunk_index == 0 && !stream_started;
  if (stream_started && *attempt != attempt_) {
    return absl::AbortedError(absl::StrCat(
        "the seed of worker \"", worker,
        "\" was started over by another Seed (or Join) while this one sent "
        "chunk ",
        chunk_index, "; this Seed no longer counts"));
  }
  const uint32_t expected = starts || fresh_stream ? 0 : seeded_chunks_;
  if (chunk_index != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("seed chunk_index ", chunk_index,
                     " out of order: expected ", expected));
  }
  if (!reseeding_ && anchor_round != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a seed is the anchor of round 0, got anchor_round ", anchor_round));
  }
  if (reseeding_ && !starts && anchor_round != reseed_anchor_round_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "re-seed chunk ", chunk_index, " has anchor_round ", anchor_round,
        ", chunk 0 had ", reseed_anchor_round_));
  }
  if (starts) {
    attempt_ = ++last_attempt_;
    seeded_chunks_ = 0;
    if (reseeding_) reseed_anchor_round_ = anchor_round;
    if (attempt != nullptr) *attempt = attempt_;
  }
  return ++seeded_chunks_ == num_chunks;
}

}  // namespace co2::server
