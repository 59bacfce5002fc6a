#include "server/job/update_cache.h"

#include <utility>

namespace co2::server {

void UpdateCache::AddStreamed(std::shared_ptr<const v1::OuterUpdate> chunk) {
  streamed_.push_back(std::move(chunk));
}

void UpdateCache::AddUnpublished(std::shared_ptr<const UpdateChunks> update) {
  auto streamed = std::make_shared<const UpdateChunks>(std::move(streamed_));
  streamed_.clear();
  std::shared_ptr<const UpdateChunks> unsent = update;
  if (!streamed->empty()) {
    std::vector<bool> sent(update->size(), false);
    for (const auto& chunk : *streamed) sent[chunk->chunk_index()] = true;
    auto rest = std::make_shared<UpdateChunks>();
    for (const auto& chunk : *update) {
      if (!sent[chunk->chunk_index()]) rest->push_back(chunk);
    }
    unsent = std::move(rest);
  }
  unpublished_.push_back(Unpublished{KeptUpdate(std::move(update)),
                                     std::move(streamed), std::move(unsent)});
}

void UpdateCache::AddPublished(std::shared_ptr<const UpdateChunks> update) {
  published_.emplace_back(std::move(update));
}

std::vector<std::shared_ptr<const UpdateChunks>> UpdateCache::Publish(
    std::shared_ptr<const CheckpointedUpdate> stored) {
  std::vector<std::shared_ptr<const UpdateChunks>> released;
  for (Unpublished& pending : unpublished_) {
    if (!pending.unsent->empty()) released.push_back(std::move(pending.unsent));
    published_.push_back(std::move(pending.update));
  }
  unpublished_.clear();
  Trim(replay_rounds_);
  if (stored != nullptr && !published_.empty()) {
    published_.back().Store(std::move(stored));
  }
  return released;
}

std::optional<KeptUpdate> UpdateCache::Last() const {
  if (!unpublished_.empty()) return unpublished_.back().update;
  if (!published_.empty()) return published_.back();
  return std::nullopt;
}

std::vector<KeptUpdate> UpdateCache::All() const {
  std::vector<KeptUpdate> all = published_;
  for (const Unpublished& pending : unpublished_) all.push_back(pending.update);
  return all;
}

std::optional<uint64_t> UpdateCache::OldestRound() const {
  if (!published_.empty()) return published_.front().round();
  if (!unpublished_.empty()) return unpublished_.front().update.round();
  return std::nullopt;
}

std::vector<KeptUpdate> UpdateCache::PublishedSince(uint64_t from_round) const {
  std::vector<KeptUpdate> since;
  for (const KeptUpdate& update : published_) {
    if (update.round() >= from_round) since.push_back(update);
  }
  return since;
}

std::vector<std::shared_ptr<const UpdateChunks>>
UpdateCache::StreamedUnpublishedSince(uint64_t from_round) const {
  std::vector<std::shared_ptr<const UpdateChunks>> since;
  for (const Unpublished& pending : unpublished_) {
    if (pending.update.round() >= from_round && !pending.streamed->empty()) {
      since.push_back(pending.streamed);
    }
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
