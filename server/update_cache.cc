#include "server/update_cache.h"

#include <utility>

namespace co2::server {
namespace {

uint64_t RoundOf(const UpdateChunks& update) { return update[0]->round(); }

}  // namespace

void UpdateCache::AddUnpublished(std::shared_ptr<const UpdateChunks> update) {
  unpublished_.push_back(std::move(update));
}

void UpdateCache::AddPublished(std::shared_ptr<const UpdateChunks> update) {
  published_.push_back(std::move(update));
}

std::vector<std::shared_ptr<const UpdateChunks>> UpdateCache::Publish() {
  std::vector<std::shared_ptr<const UpdateChunks>> released;
  released.swap(unpublished_);
  for (const auto& update : released) published_.push_back(update);
  Trim(replay_rounds_);
  return released;
}

std::shared_ptr<const UpdateChunks> UpdateCache::Last() const {
  if (!unpublished_.empty()) return unpublished_.back();
  if (!published_.empty()) return published_.back();
  return nullptr;
}

std::optional<uint64_t> UpdateCache::OldestRound() const {
  if (!published_.empty()) return RoundOf(*published_.front());
  if (!unpublished_.empty()) return RoundOf(*unpublished_.front());
  return std::nullopt;
}

std::vector<std::shared_ptr<const UpdateChunks>> UpdateCache::PublishedSince(
    uint64_t from_round) const {
  std::vector<std::shared_ptr<const UpdateChunks>> since;
  for (const auto& update : published_) {
    if (RoundOf(*update) >= from_round) since.push_back(update);
  }
  return since;
}

void UpdateCache::Trim(size_t keep) {
  while (!published_.empty() &&
         published_.size() + unpublished_.size() > keep) {
    published_.erase(published_.begin());
  }
}

}  // namespace co2::server
