#include "server/storage/kept_update.h"

#include <utility>

#include "common/status_macros.h"

namespace co2::server {

KeptUpdate::KeptUpdate(std::shared_ptr<const UpdateChunks> chunks)
    : round_(chunks->front()->round()),
      contributors_(chunks->front()->contributors()),
      num_chunks_(static_cast<uint32_t>(chunks->size())),
      chunks_(std::move(chunks)) {}

void KeptUpdate::Store(std::shared_ptr<const CheckpointedUpdate> stored) {
  if (chunks_ != nullptr) {
    auto fields = std::make_shared<v1::OuterUpdate>(*chunks_->front());
    fields->clear_payload();
    fields_ = std::move(fields);
    auto digests = std::make_shared<std::vector<uint64_t>>();
    for (const auto& chunk : *chunks_) {
      digests->push_back(chunk->anchor_digest());
    }
    digests_ = std::move(digests);
  }
  stored_ = std::move(stored);
  chunks_ = nullptr;
}

size_t KeptUpdate::PayloadBytes(uint32_t chunk) const {
  return chunks_ != nullptr ? (*chunks_)[chunk]->payload().size()
                            : stored_->chunk_bytes(chunk);
}

uint64_t KeptUpdate::AnchorDigest(uint32_t chunk) const {
  return chunks_ != nullptr ? (*chunks_)[chunk]->anchor_digest()
                            : (*digests_)[chunk];
}

absl::StatusOr<std::string_view> KeptUpdate::Payload(
    uint32_t chunk, std::string* scratch) const {
  if (chunks_ != nullptr) return (*chunks_)[chunk]->payload();
  CO2_RETURN_IF_ERROR(stored_->Read(chunk, scratch));
  return std::string_view(*scratch);
}

absl::StatusOr<std::shared_ptr<const v1::OuterUpdate>> KeptUpdate::Chunk(
    uint32_t chunk) const {
  if (chunks_ != nullptr) return (*chunks_)[chunk];
  auto message = std::make_shared<v1::OuterUpdate>(*fields_);
  message->set_chunk_index(chunk);
  message->set_anchor_digest((*digests_)[chunk]);
  CO2_RETURN_IF_ERROR(stored_->Read(chunk, message->mutable_payload()));
  return message;
}

}  // namespace co2::server
