// Test helper: chunks written to a file behind a few bytes of something else,
// as a CheckpointedUpdate reads them (the file itself is already unlinked).
#ifndef CO2_TESTS_STORED_CHUNKS_H_
#define CO2_TESTS_STORED_CHUNKS_H_

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "server/storage/checkpointed_update.h"

namespace co2::server {

inline constexpr char kStoredPrefix[] = "header bytes before the update";

// A file holding kStoredPrefix then `chunks` back to back. `path` receives
// its name (unlinked unless `keep_file`).
inline std::shared_ptr<const CheckpointedUpdate> StoreChunks(
    const std::vector<std::string>& chunks, std::string* path = nullptr,
    bool keep_file = false) {
  char pattern[] = "/tmp/co2-stored-XXXXXX";
  const int fd = mkstemp(pattern);
  if (fd < 0) return nullptr;
  std::string bytes = kStoredPrefix;
  std::vector<uint32_t> sizes;
  for (const std::string& chunk : chunks) {
    bytes += chunk;
    sizes.push_back(static_cast<uint32_t>(chunk.size()));
  }
  if (::write(fd, bytes.data(), bytes.size()) !=
      static_cast<ssize_t>(bytes.size())) {
    ::close(fd);
    return nullptr;
  }
  if (!keep_file) ::unlink(pattern);
  if (path != nullptr) *path = pattern;
  return std::make_shared<const CheckpointedUpdate>(fd, pattern,
                                              sizeof(kStoredPrefix) - 1, sizes);
}

}  // namespace co2::server

#endif  // CO2_TESTS_STORED_CHUNKS_H_
