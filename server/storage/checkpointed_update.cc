#include "server/storage/checkpointed_update.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace co2::server {

CheckpointedUpdate::CheckpointedUpdate(int fd, std::string path,
                                       uint64_t first_offset,
                                       const std::vector<uint32_t>& sizes)
    : fd_(fd), path_(std::move(path)), sizes_(sizes) {
  offsets_.reserve(sizes_.size());
  uint64_t offset = first_offset;
  for (uint32_t size : sizes_) {
    offsets_.push_back(offset);
    offset += size;
  }
}

CheckpointedUpdate::~CheckpointedUpdate() { ::close(fd_); }

absl::Status CheckpointedUpdate::Read(uint32_t chunk, std::string* out) const {
  out->resize(sizes_[chunk]);
  size_t done = 0;
  while (done < out->size()) {
    const ssize_t n = ::pread(fd_, out->data() + done, out->size() - done,
                              static_cast<off_t>(offsets_[chunk] + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::UnavailableError(absl::StrCat("cannot read update chunk ",
                                                 chunk, " back from ", path_,
                                                 ": ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(
          "update chunk ", chunk, " of ", path_, " ends after ", done, " of ",
          out->size(), " bytes: the file was truncated"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace co2::server
