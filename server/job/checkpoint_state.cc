#include "server/job/checkpoint_state.h"

#include <sys/mman.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/status_macros.h"

namespace co2::server {
namespace {

// `n` zero floats that cost no memory: untouched private anonymous pages all
// read as the kernel's zero page. The checkpoint format has a momentum that a
// job with β = 0 does not keep; this is what it writes.
class ZeroFloats {
 public:
  explicit ZeroFloats(size_t n) : bytes_(n * sizeof(float)) {
    if (bytes_ == 0) return;
    void* pages =
        mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages != MAP_FAILED) data_ = static_cast<const float*>(pages);
  }
  ZeroFloats(const ZeroFloats&) = delete;
  ZeroFloats& operator=(const ZeroFloats&) = delete;
  ~ZeroFloats() {
    if (data_ != nullptr) munmap(const_cast<float*>(data_), bytes_);
  }

  bool ok() const { return bytes_ == 0 || data_ != nullptr; }
  absl::Span<const float> span() const {
    return absl::MakeConstSpan(data_, bytes_ / sizeof(float));
  }

 private:
  const size_t bytes_;
  const float* data_ = nullptr;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const CheckpointedUpdate>> WriteShardCheckpoint(
    const CheckpointStore& store, const v1::ShardCheckpointHeader& header,
    absl::Span<const float> anchor, absl::Span<const float> momentum,
    const KeptUpdate* last_update,
    std::vector<const KeptUpdate*> earlier_updates) {
  CheckpointView view;
  view.header = &header;
  view.anchor = anchor;
  const ZeroFloats zeros(momentum.empty() ? anchor.size() : 0);
  if (!zeros.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot map ", anchor.size(), " zero floats for the momentum"));
  }
  view.momentum = momentum.empty() ? zeros.span() : momentum;
  view.update = last_update;
  view.earlier_updates = std::move(earlier_updates);
  return store.Write(view);
}

absl::Status CheckpointDataLoss(const std::string& job,
                                const std::string& what) {
  return absl::DataLossError(
      absl::StrCat("checkpoint of job \"", job, "\": ", what));
}

absl::Status CheckCheckpointFits(const LoadedCheckpoint& checkpoint,
                                 common::Range range, uint32_t shard_index,
                                 uint32_t num_chunks) {
  const v1::ShardCheckpointHeader& h = checkpoint.header;
  if (range.begin != h.range_begin() || range.end != h.range_end() ||
      checkpoint.anchor.size() != range.size() ||
      checkpoint.momentum.size() != range.size()) {
    return CheckpointDataLoss(
        h.job(), absl::StrCat("covers [", h.range_begin(), ", ",
                              h.range_end(), ") but shard ", shard_index,
                              " owns [", range.begin, ", ", range.end, ")"));
  }
  // A shard re-seeded at a later round holds no update until it closes one.
  const size_t expected_chunks = h.rounds_closed() > 0 ? num_chunks : 0;
  if (!checkpoint.update_chunks.empty() &&
      checkpoint.update_chunks.size() != expected_chunks) {
    return CheckpointDataLoss(
        h.job(), absl::StrCat("has ", checkpoint.update_chunks.size(),
                              " update chunks, expected ", expected_chunks));
  }
  for (int i = 0; i < h.earlier_updates_size(); ++i) {
    const size_t chunks =
        static_cast<size_t>(i) < checkpoint.earlier_update_chunks.size()
            ? checkpoint.earlier_update_chunks[i].size()
            : 0;
    if (chunks != num_chunks) {
      return CheckpointDataLoss(
          h.job(), absl::StrCat("has ", chunks, " chunks of the update of round ",
                                h.earlier_updates(i).round(), ", expected ",
                                num_chunks));
    }
  }
  return absl::OkStatus();
}

namespace {

// The update of `round` from its encoded `chunks` (moved out), as the
// messages `messages` makes.
absl::StatusOr<std::shared_ptr<const UpdateChunks>> RestoreUpdate(
    const v1::ShardCheckpointHeader& h, uint64_t round, uint32_t contributors,
    std::vector<std::string>& chunks,
    const google::protobuf::RepeatedField<uint64_t>& digests,
    const ShardStepConfig& step, const UpdateMessages& messages) {
  const common::Codec codec = common::Codec(h.config().downlink_codec());
  auto update = std::make_shared<UpdateChunks>();
  for (uint32_t i = 0; i < step.num_chunks(); ++i) {
    const common::Range r = common::ChunkRange(step.elements(), i);
    std::string& bytes = chunks[i];
    absl::Status valid = common::Validate(codec, bytes, r.size());
    if (!valid.ok()) {
      return CheckpointDataLoss(h.job(), std::string(valid.message()));
    }
    const uint64_t digest =
        static_cast<int>(i) < digests.size() ? digests[static_cast<int>(i)] : 0;
    update->push_back(
        messages.Make(round, i, contributors, std::move(bytes), digest));
  }
  return update;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const UpdateChunks>> RestoreLastUpdate(
    LoadedCheckpoint& checkpoint, const ShardStepConfig& step,
    const UpdateMessages& messages) {
  const v1::ShardCheckpointHeader& h = checkpoint.header;
  return RestoreUpdate(h, h.rounds_closed() - 1, h.update_contributors(),
                       checkpoint.update_chunks, h.update_chunk_digests(),
                       step, messages);
}

absl::StatusOr<std::vector<std::shared_ptr<const UpdateChunks>>>
RestoreEarlierUpdates(LoadedCheckpoint& checkpoint,
                      const ShardStepConfig& step,
                      const UpdateMessages& messages) {
  const v1::ShardCheckpointHeader& h = checkpoint.header;
  std::vector<std::shared_ptr<const UpdateChunks>> updates;
  for (int i = 0; i < h.earlier_updates_size(); ++i) {
    const v1::CheckpointUpdate& earlier = h.earlier_updates(i);
    CO2_ASSIGN_OR_RETURN(
        std::shared_ptr<const UpdateChunks> update,
        RestoreUpdate(h, earlier.round(), earlier.contributors(),
                      checkpoint.earlier_update_chunks[i],
                      earlier.chunk_digests(), step, messages));
    updates.push_back(std::move(update));
  }
  return updates;
}

absl::Status JournalDataLoss(const std::string& path, uint32_t chunk_index,
                             const std::string& what) {
  return absl::DataLossError(absl::StrCat("round journal ", path, ": chunk ",
                                          chunk_index, ": ", what));
}

absl::Status CheckJournalChunkFits(const LoadedJournalChunk& chunk,
                                   const ShardStepConfig& step, bool momentum,
                                   const std::string& path) {
  const v1::JournalChunkHeader& h = chunk.header;
  const auto loss = [&](const std::string& what) {
    return JournalDataLoss(path, h.chunk_index(), what);
  };
  if (h.chunk_index() >= step.num_chunks()) {
    return loss(absl::StrCat("out of range: the shard has ", step.num_chunks(),
                             " chunks"));
  }
  const size_t n = common::ChunkRange(step.elements(), h.chunk_index()).size();
  if (chunk.anchor.size() != n || chunk.momentum.size() != (momentum ? n : 0)) {
    return loss(absl::StrCat("anchor of ", chunk.anchor.size(),
                             " and momentum of ", chunk.momentum.size(),
                             " elements, expected ", n, " and ",
                             momentum ? n : 0));
  }
  const absl::Status valid = common::Validate(step.codec(), chunk.update, n);
  if (!valid.ok()) return loss(std::string(valid.message()));
  return absl::OkStatus();
}

}  // namespace co2::server
