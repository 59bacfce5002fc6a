#include "server/storage/checkpoint_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/storage/durable_file.h"

namespace co2::server {
namespace {

constexpr char kMagic[8] = {'C', 'O', '2', 'C', 'K', 'P', 'T', '1'};
constexpr uint32_t kFormatVersion = 1;

// Writes and syncs the file; returns its descriptor, still open for
// reading, or closes it on failure.
absl::StatusOr<int> WriteFile(const std::string& path,
                              const CheckpointView& view,
                              const std::string& header) {
  const int fd =
      ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("cannot create", path, errno);
  FileWriter out(fd, path);
  const absl::Status status = [&]() -> absl::Status {
    const uint32_t header_size = static_cast<uint32_t>(header.size());
    CO2_RETURN_IF_ERROR(out.Append(kMagic, sizeof(kMagic)));
    CO2_RETURN_IF_ERROR(out.Append(&header_size, sizeof(header_size)));
    CO2_RETURN_IF_ERROR(out.Append(header.data(), header.size()));
    CO2_RETURN_IF_ERROR(
        out.Append(view.anchor.data(), view.anchor.size() * sizeof(float)));
    CO2_RETURN_IF_ERROR(
        out.Append(view.momentum.data(), view.momentum.size() * sizeof(float)));
    std::vector<const KeptUpdate*> updates;
    if (view.update != nullptr) updates.push_back(view.update);
    updates.insert(updates.end(), view.earlier_updates.begin(),
                   view.earlier_updates.end());
    std::string scratch;
    for (const KeptUpdate* update : updates) {
      for (uint32_t i = 0; i < update->num_chunks(); ++i) {
        CO2_ASSIGN_OR_RETURN(std::string_view chunk,
                             update->Payload(i, &scratch));
        CO2_RETURN_IF_ERROR(out.Append(chunk.data(), chunk.size()));
      }
    }
    const uint32_t crc = out.crc();
    CO2_RETURN_IF_ERROR(out.Append(&crc, sizeof(crc)));
    if (::fsync(fd) != 0) return ErrnoStatus("cannot fsync", path, errno);
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    ::close(fd);
    return status;
  }
  return fd;
}

absl::Status DataLoss(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", what));
}

// Hex-escapes every byte outside [A-Za-z0-9_-] so a job name is one safe
// path element.
std::string EscapeJob(const std::string& job) {
  std::string out;
  for (unsigned char c : job) {
    if (std::isalnum(c) || c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrFormat("%%%02x", c);
    }
  }
  return out;
}

}  // namespace

std::string CheckpointStore::PathFor(const std::string& job,
                                     uint32_t shard_index,
                                     uint32_t num_shards) const {
  return absl::StrCat(dir_, "/", EscapeJob(job), ".shard-", shard_index, "-of-",
                      num_shards, ".ckpt");
}

std::string CheckpointStore::JournalPathFor(const std::string& job,
                                            uint32_t shard_index,
                                            uint32_t num_shards) const {
  return PathFor(job, shard_index, num_shards) + ".journal";
}

absl::StatusOr<std::shared_ptr<const CheckpointedUpdate>>
CheckpointStore::Write(const CheckpointView& view) const {
  CO2_RETURN_IF_ERROR(MakeDirectories(dir_));
  v1::ShardCheckpointHeader header = *view.header;
  header.set_format_version(kFormatVersion);
  header.clear_update_chunk_bytes();
  header.clear_update_chunk_digests();
  if (view.update != nullptr) {
    for (uint32_t i = 0; i < view.update->num_chunks(); ++i) {
      header.add_update_chunk_bytes(
          static_cast<uint32_t>(view.update->PayloadBytes(i)));
      header.add_update_chunk_digests(view.update->AnchorDigest(i));
    }
  }
  header.clear_earlier_updates();
  for (const KeptUpdate* update : view.earlier_updates) {
    v1::CheckpointUpdate* earlier = header.add_earlier_updates();
    earlier->set_round(update->round());
    earlier->set_contributors(update->contributors());
    for (uint32_t i = 0; i < update->num_chunks(); ++i) {
      earlier->add_chunk_bytes(static_cast<uint32_t>(update->PayloadBytes(i)));
      earlier->add_chunk_digests(update->AnchorDigest(i));
    }
  }
  const std::string path = PathFor(header.job(), header.shard_index(),
                                   header.config().num_shards());
  const std::string temp = path + ".tmp";
  const std::string header_bytes = header.SerializeAsString();
  absl::StatusOr<int> fd = WriteFile(temp, view, header_bytes);
  absl::Status status = fd.status();
  if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus("cannot rename to", path, errno);
  }
  if (status.ok()) status = SyncDirectory(dir_);
  if (!status.ok()) {
    if (fd.ok()) ::close(*fd);
    ::unlink(temp.c_str());
    return status;
  }
  if (view.update == nullptr) {
    ::close(*fd);
    return nullptr;
  }
  const uint64_t update_offset =
      sizeof(kMagic) + sizeof(uint32_t) + header_bytes.size() +
      (view.anchor.size() + view.momentum.size()) * sizeof(float);
  return std::make_shared<const CheckpointedUpdate>(
      *fd, path, update_offset,
      std::vector<uint32_t>(header.update_chunk_bytes().begin(),
                            header.update_chunk_bytes().end()));
}

absl::StatusOr<LoadedCheckpoint> CheckpointStore::Load(const std::string& path) {
  CO2_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  const size_t fixed = sizeof(kMagic) + sizeof(uint32_t) + sizeof(uint32_t);
  if (bytes.size() < fixed || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return DataLoss(path, "not a co2 checkpoint (bad magic or too short)");
  }
  uint32_t stored_crc = 0;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - sizeof(stored_crc),
              sizeof(stored_crc));
  const uint32_t crc = Crc32(bytes.data(), bytes.size() - sizeof(stored_crc));
  if (crc != stored_crc) {
    return DataLoss(path, absl::StrFormat("checksum mismatch (stored %08x, "
                                          "computed %08x): torn or corrupted",
                                          stored_crc, crc));
  }
  uint32_t header_size = 0;
  std::memcpy(&header_size, bytes.data() + sizeof(kMagic), sizeof(header_size));
  size_t offset = sizeof(kMagic) + sizeof(header_size);
  LoadedCheckpoint loaded;
  if (header_size > bytes.size() - fixed ||
      !loaded.header.ParseFromArray(bytes.data() + offset, header_size)) {
    return DataLoss(path, "unreadable header");
  }
  offset += header_size;
  const v1::ShardCheckpointHeader& h = loaded.header;
  if (h.format_version() != kFormatVersion) {
    return DataLoss(path, absl::StrCat("unknown format version ", h.format_version()));
  }
  const size_t n = h.range_end() - h.range_begin();
  size_t update_bytes = 0;
  for (uint32_t size : h.update_chunk_bytes()) update_bytes += size;
  for (const v1::CheckpointUpdate& earlier : h.earlier_updates()) {
    for (uint32_t size : earlier.chunk_bytes()) update_bytes += size;
  }
  const size_t body = bytes.size() - sizeof(stored_crc) - offset;
  if (h.range_end() < h.range_begin() || body != 2 * n * sizeof(float) + update_bytes) {
    return DataLoss(path, absl::StrCat("body of ", body, " bytes does not match a range of ",
                                       n, " elements and ", update_bytes,
                                       " update bytes"));
  }
  loaded.anchor.resize(n);
  loaded.momentum.resize(n);
  std::memcpy(loaded.anchor.data(), bytes.data() + offset, n * sizeof(float));
  offset += n * sizeof(float);
  std::memcpy(loaded.momentum.data(), bytes.data() + offset, n * sizeof(float));
  offset += n * sizeof(float);
  for (uint32_t size : h.update_chunk_bytes()) {
    loaded.update_chunks.emplace_back(bytes.data() + offset, size);
    offset += size;
  }
  for (const v1::CheckpointUpdate& earlier : h.earlier_updates()) {
    std::vector<std::string>& chunks = loaded.earlier_update_chunks.emplace_back();
    for (uint32_t size : earlier.chunk_bytes()) {
      chunks.emplace_back(bytes.data() + offset, size);
      offset += size;
    }
  }
  return loaded;
}

absl::StatusOr<std::string> CheckpointStore::SetAside(const std::string& path) {
  const std::string aside =
      absl::StrCat(path, ".corrupt-", absl::ToUnixMillis(absl::Now()));
  if (::rename(path.c_str(), aside.c_str()) != 0) {
    return ErrnoStatus(absl::StrCat("cannot rename ", path, " to"), aside,
                       errno);
  }
  return aside;
}

std::vector<LoadedCheckpoint> CheckpointStore::LoadAll(
    uint32_t shard_index, uint32_t num_shards,
    std::vector<UnusableCheckpoint>* unusable) const {
  std::vector<LoadedCheckpoint> loaded;
  DIR* dir = ::opendir(dir_.c_str());
  if (dir == nullptr) return loaded;  // no directory yet: nothing to restore
  const std::string suffix =
      absl::StrCat(".shard-", shard_index, "-of-", num_shards, ".ckpt");
  while (dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (!absl::EndsWith(name, suffix)) continue;
    const std::string path = absl::StrCat(dir_, "/", name);
    absl::StatusOr<LoadedCheckpoint> one = Load(path);
    if (one.ok() && (one->header.shard_index() != shard_index ||
                     one->header.config().num_shards() != num_shards)) {
      one = DataLoss(path, "belongs to another shard layout");
    }
    if (one.ok()) {
      loaded.push_back(*std::move(one));
    } else {
      unusable->push_back(UnusableCheckpoint{path, one.status()});
    }
  }
  ::closedir(dir);
  return loaded;
}

}  // namespace co2::server
