#include "server/update_cache.h"

#include <utility>

namespace co2::server {

void UpdateCache::AddUnpublished(std::shared_ptr<const UpdateChunks> update) {
  unpublished_.emplace_back(std::move(update));
}

void UpdateCache::AddPublished(std::shared_ptr<const UpdateChunks> update) {
  published_.emplace_back(std::move(update));
}

std::vector<std::shared_ptr<const UpdateChunks>> UpdateCache::Publish(
    std::shared_ptr<const StoredUpdate> stored) {
  std::vector<std::shared_ptr<const UpdateChunks>> released;
  for (KeptUpdate& update : unpublished_) {
    released.push_back(update.chunks());  // unpublished: in memory
    published_.push_back(std::move(update));
  }
  unpublished_.clear();
  Trim(replay_rounds_);
  if (stored != nullptr && !published_.empty()) {
    published_.back().Store(std::move(stored));
  }
  return released;
}

std::optional<KeptUpdate> UpdateCache::Last() const {
  if (!unpublished_.empty()) return unpublished_.back();
  if (!published_.empty()) return published_.back();
  return std::nullopt;
}

std::optional<uint64_t> UpdateCache::OldestRound() const {
  if (!published_.empty()) return published_.front().round();
  if (!unpublished_.empty()) return unpublished_.front().round();
  return std::nullopt;
}

std::vector<KeptUpdate> UpdateCache::PublishedSince(uint64_t from_round) const {
  std::vector<KeptUpdate> since;
  for (const KeptUpdate& update : published_) {
    if (update.round() >= from_round) since.push_back(update);
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
