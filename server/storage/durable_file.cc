#include "server/storage/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/storage/write_failure.h"

namespace co2::server {

absl::Status ErrnoStatus(const std::string& what, const std::string& path,
                         int err) {
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  return WithErrno(err == ENOSPC || err == EDQUOT
                       ? absl::ResourceExhaustedError(message)
                       : absl::UnavailableError(message),
                   err);
}

FileWriter::FileWriter(int fd, std::string path)
    : fd_(fd), path_(std::move(path)), crc_(crc32_z(0L, Z_NULL, 0)) {}

absl::Status FileWriter::Append(const void* data, size_t size) {
  // zlib takes a null buffer as "start over": an empty span has one.
  if (size == 0) return absl::OkStatus();
  crc_ = crc32_z(crc_, static_cast<const Bytef*>(data), size);
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("cannot write", path_, errno);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

void FileWriter::ResetCrc() { crc_ = crc32_z(0L, Z_NULL, 0); }

uint32_t Crc32(const void* data, size_t size) {
  return static_cast<uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), static_cast<const Bytef*>(data), size));
}

absl::Status MakeDirectories(const std::string& dir) {
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string prefix = dir.substr(0, end);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus("cannot create directory", prefix, errno);
    }
    if (end == std::string::npos) return absl::OkStatus();
  }
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : ErrnoStatus("cannot fsync", dir, err);
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", path, errno);
  std::string bytes;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus("cannot read", path, err);
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return bytes;
}

}  // namespace co2::server
