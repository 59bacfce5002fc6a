#include "server/job/round_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/storage/durable_file.h"

namespace co2::server {
namespace {

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Reads a u32 at `offset` of `bytes`; false past the end.
bool ReadU32(const std::string& bytes, size_t offset, uint32_t* value) {
  if (offset > bytes.size() || bytes.size() - offset < sizeof(*value)) {
    return false;
  }
  std::memcpy(value, bytes.data() + offset, sizeof(*value));
  return true;
}

}  // namespace

RoundJournal::RoundJournal(std::string path) : path_(std::move(path)) {}

RoundJournal::~RoundJournal() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status RoundJournal::Open() {
  if (fd_ >= 0) return absl::OkStatus();
  // A journal left by an earlier process is emptied before it is appended
  // to: whatever it holds is of a round before this one.
  const int fd =
      ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("cannot create", path_, errno);
  fd_ = fd;
  empty_ = true;
  return SyncDirectory(DirectoryOf(path_));
}

absl::Status RoundJournal::Truncate() {
  if (::ftruncate(fd_, 0) != 0) {
    return ErrnoStatus("cannot truncate", path_, errno);
  }
  if (::lseek(fd_, 0, SEEK_SET) < 0) {
    return ErrnoStatus("cannot seek", path_, errno);
  }
  empty_ = true;
  return absl::OkStatus();
}

absl::Status RoundJournal::Append(uint64_t round,
                                  absl::Span<const JournalChunk> chunks) {
  CO2_RETURN_IF_ERROR(Open());
  if (!empty_ && round_ != round) CO2_RETURN_IF_ERROR(Truncate());
  FileWriter out(fd_, path_);
  for (const JournalChunk& chunk : chunks) {
    v1::JournalChunkHeader header;
    header.set_round(round);
    header.set_chunk_index(chunk.chunk_index);
    header.set_contributors(chunk.contributors);
    for (const ChunkSender& sender : chunk.senders) {
      v1::JournalSender* s = header.add_senders();
      s->set_worker_id(sender.worker);
      s->set_contribution_weight(sender.contribution_weight);
    }
    header.set_anchor_floats(chunk.anchor.size());
    header.set_momentum_floats(chunk.momentum.size());
    header.set_update_bytes(chunk.update.size());
    const std::string header_bytes = header.SerializeAsString();
    const uint32_t header_size = static_cast<uint32_t>(header_bytes.size());
    out.ResetCrc();
    CO2_RETURN_IF_ERROR(out.Append(&header_size, sizeof(header_size)));
    CO2_RETURN_IF_ERROR(out.Append(header_bytes.data(), header_bytes.size()));
    CO2_RETURN_IF_ERROR(
        out.Append(chunk.anchor.data(), chunk.anchor.size() * sizeof(float)));
    CO2_RETURN_IF_ERROR(out.Append(chunk.momentum.data(),
                                   chunk.momentum.size() * sizeof(float)));
    CO2_RETURN_IF_ERROR(out.Append(chunk.update.data(), chunk.update.size()));
    const uint32_t crc = out.crc();
    CO2_RETURN_IF_ERROR(out.Append(&crc, sizeof(crc)));
    empty_ = false;
    round_ = round;
  }
  if (::fsync(fd_) != 0) return ErrnoStatus("cannot fsync", path_, errno);
  return absl::OkStatus();
}

absl::Status RoundJournal::Clear() {
  if (fd_ >= 0) {
    if (empty_) return absl::OkStatus();
    ::close(fd_);
    fd_ = -1;
    empty_ = true;
  }
  // No directory sync: a journal that comes back after a crash holds a
  // round the checkpoint has closed, which Load ignores.
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus("cannot remove", path_, errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LoadedJournalChunk>> RoundJournal::Load(
    const std::string& path, uint64_t round) {
  std::vector<LoadedJournalChunk> chunks;
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return chunks;
  CO2_ASSIGN_OR_RETURN(const std::string bytes, ReadWholeFile(path));
  size_t offset = 0;
  while (offset < bytes.size()) {
    const size_t start = offset;
    uint32_t header_size = 0;
    LoadedJournalChunk chunk;
    v1::JournalChunkHeader& h = chunk.header;
    const bool header_read =
        ReadU32(bytes, offset, &header_size) &&
        bytes.size() - offset - sizeof(header_size) >= header_size &&
        h.ParseFromArray(bytes.data() + offset + sizeof(header_size),
                         static_cast<int>(header_size));
    const size_t body_begin = offset + sizeof(header_size) + header_size;
    const uint64_t body =
        header_read
            ? (h.anchor_floats() + h.momentum_floats()) * sizeof(float) +
                  h.update_bytes()
            : 0;
    uint32_t stored_crc = 0;
    if (!header_read || body > bytes.size() - body_begin ||
        !ReadU32(bytes, body_begin + body, &stored_crc) ||
        Crc32(bytes.data() + start, body_begin + body - start) != stored_crc) {
      CO2_LOG(WARNING) << "round journal " << path << ": the record at byte "
                       << start << " of " << bytes.size()
                       << " is cut short or fails its checksum; it was never "
                          "synced (so never sent), and is ignored with "
                          "anything after it";
      break;
    }
    offset = body_begin + body + sizeof(stored_crc);
    if (h.round() != round) continue;
    const char* p = bytes.data() + body_begin;
    chunk.anchor.resize(h.anchor_floats());
    std::memcpy(chunk.anchor.data(), p, h.anchor_floats() * sizeof(float));
    p += h.anchor_floats() * sizeof(float);
    chunk.momentum.resize(h.momentum_floats());
    std::memcpy(chunk.momentum.data(), p, h.momentum_floats() * sizeof(float));
    p += h.momentum_floats() * sizeof(float);
    chunk.update.assign(p, h.update_bytes());
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

}  // namespace co2::server
