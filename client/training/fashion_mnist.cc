#include "client/training/fashion_mnist.h"

#include <zlib.h>

#include <cerrno>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace co2::client {
namespace {

constexpr size_t kImagesHeaderBytes = 16;  // magic, count, rows, cols
constexpr size_t kLabelsHeaderBytes = 8;   // magic, count

// Closes a gzFile on every path out of ReadGzipFile.
struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose_r(f); }
};

// The decompressed contents of `path`. zlib reads a file that is not gzip
// as is, which is fine: the magic check then reports it.
absl::StatusOr<std::string> ReadGzipFile(const std::string& path) {
  errno = 0;
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    const int err = errno;
    if (err == 0) {  // zlib itself failed (out of memory), not the OS
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": gzopen failed"));
    }
    return absl::ErrnoToStatus(err, path);
  }
  gzbuffer(file.get(), 1 << 17);
  std::string data;
  constexpr unsigned kChunk = 1 << 20;
  for (;;) {
    const size_t old_size = data.size();
    data.resize(old_size + kChunk);
    const int n = gzread(file.get(), data.data() + old_size, kChunk);
    if (n < 0) {
      int errnum = 0;
      const char* message = gzerror(file.get(), &errnum);
      return absl::DataLossError(
          absl::StrCat(path, ": cannot decompress: ", message));
    }
    data.resize(old_size + static_cast<size_t>(n));
    if (n == 0) break;
  }
  // A truncated stream ends with a short read and Z_BUF_ERROR ("unexpected
  // end of file") rather than a negative count, so check after the loop.
  int errnum = Z_OK;
  const char* message = gzerror(file.get(), &errnum);
  if (errnum != Z_OK) {
    return absl::DataLossError(
        absl::StrCat(path, ": corrupt gzip stream: ", message));
  }
  return data;
}

uint32_t ReadBigEndian32(const std::string& data, size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data() + offset);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

absl::Status CheckMagic(const std::string& path, uint32_t magic,
                        uint32_t expected) {
  if (magic == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: bad magic 0x%08x, expected 0x%08x", path, magic, expected));
}

absl::Status CheckLength(const std::string& path, const std::string& data,
                         uint64_t expected, uint32_t count, const char* what) {
  if (data.size() == expected) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      path, ": ", data.size(), " bytes after decompression, but the header's ",
      count, " ", what, " need ", expected,
      data.size() < expected ? " (truncated)" : " (trailing bytes)"));
}

absl::StatusOr<std::vector<uint8_t>> ParseImages(const std::string& path,
                                                 const std::string& data) {
  if (data.size() < kImagesHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", data.size(), " bytes, shorter than the 16-byte header"));
  }
  CO2_RETURN_IF_ERROR(
      CheckMagic(path, ReadBigEndian32(data, 0), kIdxImagesMagic));
  const uint32_t count = ReadBigEndian32(data, 4);
  const uint32_t rows = ReadBigEndian32(data, 8);
  const uint32_t cols = ReadBigEndian32(data, 12);
  if (rows != kFashionMnistRows || cols != kFashionMnistCols) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": images are ", rows, "x", cols, ", expected ",
                     kFashionMnistRows, "x", kFashionMnistCols));
  }
  const uint64_t expected =
      kImagesHeaderBytes + uint64_t{count} * kFashionMnistPixels;
  CO2_RETURN_IF_ERROR(CheckLength(path, data, expected, count, "images"));
  return std::vector<uint8_t>(data.begin() + kImagesHeaderBytes, data.end());
}

absl::StatusOr<std::vector<uint8_t>> ParseLabels(const std::string& path,
                                                 const std::string& data) {
  if (data.size() < kLabelsHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", data.size(), " bytes, shorter than the 8-byte header"));
  }
  CO2_RETURN_IF_ERROR(
      CheckMagic(path, ReadBigEndian32(data, 0), kIdxLabelsMagic));
  const uint32_t count = ReadBigEndian32(data, 4);
  CO2_RETURN_IF_ERROR(CheckLength(
      path, data, kLabelsHeaderBytes + uint64_t{count}, count, "labels"));
  std::vector<uint8_t> labels(data.begin() + kLabelsHeaderBytes, data.end());
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= kFashionMnistClasses) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": label ", int{labels[i]}, " at index ", i,
                       " outside 0..", kFashionMnistClasses - 1));
    }
  }
  return labels;
}

std::string JoinPath(const std::string& directory, const std::string& name) {
  if (directory.empty() || directory.back() == '/') {
    return directory + name;
  }
  return absl::StrCat(directory, "/", name);
}

}  // namespace

FashionMnistFiles FashionMnistFileNames(FashionMnistSplit split) {
  const char* prefix = split == FashionMnistSplit::kTrain ? "train" : "t10k";
  return {absl::StrCat(prefix, "-images-idx3-ubyte.gz"),
          absl::StrCat(prefix, "-labels-idx1-ubyte.gz")};
}

absl::StatusOr<FashionMnistExamples> LoadFashionMnistSplit(
    const FashionMnistOptions& options, FashionMnistSplit split) {
  const FashionMnistFiles names = FashionMnistFileNames(split);
  const std::string images_path = JoinPath(options.directory, names.images);
  const std::string labels_path = JoinPath(options.directory, names.labels);

  FashionMnistExamples examples;
  {
    // Scoped so the 47 MB raw copy is freed before the labels are read.
    CO2_ASSIGN_OR_RETURN(std::string raw, ReadGzipFile(images_path));
    CO2_ASSIGN_OR_RETURN(examples.images, ParseImages(images_path, raw));
  }
  CO2_ASSIGN_OR_RETURN(std::string raw_labels, ReadGzipFile(labels_path));
  CO2_ASSIGN_OR_RETURN(examples.labels, ParseLabels(labels_path, raw_labels));

  const uint64_t num_images = examples.images.size() / kFashionMnistPixels;
  if (num_images != examples.labels.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(labels_path, ": ", examples.labels.size(), " labels, but ",
                     images_path, " has ", num_images, " images"));
  }
  return examples;
}

absl::StatusOr<FashionMnist> LoadFashionMnist(
    const FashionMnistOptions& options) {
  FashionMnist data;
  CO2_ASSIGN_OR_RETURN(
      data.train, LoadFashionMnistSplit(options, FashionMnistSplit::kTrain));
  CO2_ASSIGN_OR_RETURN(
      data.test, LoadFashionMnistSplit(options, FashionMnistSplit::kTest));
  return data;
}

}  // namespace co2::client
