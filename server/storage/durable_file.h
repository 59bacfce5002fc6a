// Writing files that must survive a crash, and reading them back: what the
// checkpoint files (server/storage/checkpoint_store.h) and the round journal
// (server/job/round_journal.h) share. Errors are statuses naming the file and
// the errno text: RESOURCE_EXHAUSTED for a full disk or quota, UNAVAILABLE
// for the rest; each carries its errno (WriteFailureOf).
//
// Stateless functions, and a writer with one owner.
#ifndef CO2_SERVER_STORAGE_DURABLE_FILE_H_
#define CO2_SERVER_STORAGE_DURABLE_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace co2::server {

// "<what> <path>: <strerror(err)>", RESOURCE_EXHAUSTED for ENOSPC/EDQUOT,
// with `err` attached (write_failure.h).
absl::Status ErrnoStatus(const std::string& what, const std::string& path,
                         int err);

// Writes everything it is given to a descriptor (borrowed) or fails, and
// keeps the CRC-32 of what it wrote since construction or ResetCrc.
class FileWriter {
 public:
  FileWriter(int fd, std::string path);

  absl::Status Append(const void* data, size_t size);
  uint32_t crc() const { return static_cast<uint32_t>(crc_); }
  void ResetCrc();

 private:
  const int fd_;
  const std::string path_;
  unsigned long crc_;
};

// CRC-32 (zlib's) of `size` bytes.
uint32_t Crc32(const void* data, size_t size);

// `dir` and any of its parents that are missing, like `mkdir -p`.
absl::Status MakeDirectories(const std::string& dir);
// fsync of a directory: a file created or renamed in it stays.
absl::Status SyncDirectory(const std::string& dir);
// The whole file.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace co2::server

#endif  // CO2_SERVER_STORAGE_DURABLE_FILE_H_
