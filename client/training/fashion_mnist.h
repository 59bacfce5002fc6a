// Fashion-MNIST loader: reads the four gzip-compressed idx files (Debian
// package dataset-fashion-mnist) into plain byte vectors and validates them
// completely (magic, 28x28 geometry, image/label counts, exact length, label
// range), so a damaged install fails at startup with the file named instead
// of training on garbage. Torch-free; the tensors are made in batches.h.
// Stateless functions; any thread.
#ifndef CO2_CLIENT_TRAINING_FASHION_MNIST_H_
#define CO2_CLIENT_TRAINING_FASHION_MNIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace co2::client {

inline constexpr int kFashionMnistRows = 28;
inline constexpr int kFashionMnistCols = 28;
inline constexpr int kFashionMnistPixels =
    kFashionMnistRows * kFashionMnistCols;
inline constexpr int kFashionMnistClasses = 10;
// idx magic numbers: 0x08 = unsigned byte, then the number of dimensions.
inline constexpr uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;

struct FashionMnistOptions {
  // Directory holding the four *-idx?-ubyte.gz files.
  std::string directory = "/usr/share/datasets/fashion-mnist";
};

enum class FashionMnistSplit { kTrain, kTest };

// One split, as stored: example i is images[i*784, (i+1)*784) (row-major,
// 0 = background, 255 = ink) with class labels[i] in 0..9.
struct FashionMnistExamples {
  std::vector<uint8_t> images;
  std::vector<uint8_t> labels;
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

struct FashionMnist {
  FashionMnistExamples train;  // 60000 examples in the official release
  FashionMnistExamples test;   // 10000 examples
};

// File names of a split inside the directory: {images, labels}.
struct FashionMnistFiles {
  std::string images;
  std::string labels;
};
FashionMnistFiles FashionMnistFileNames(FashionMnistSplit split);

// Loads one split. Every error message starts with the path of the file at
// fault:
//   NOT_FOUND         the file does not exist (other open errors keep their
//                     errno-derived code, e.g. PERMISSION_DENIED);
//   DATA_LOSS         corrupt or truncated gzip stream, or the decompressed
//                     length differs from what the header promises
//                     (truncated file or trailing bytes);
//   INVALID_ARGUMENT  bad magic, geometry other than 28x28, image and label
//                     counts differ, or a label outside 0..9.
absl::StatusOr<FashionMnistExamples> LoadFashionMnistSplit(
    const FashionMnistOptions& options, FashionMnistSplit split);

// Loads both splits; fails with the first split's error.
absl::StatusOr<FashionMnist> LoadFashionMnist(
    const FashionMnistOptions& options);

}  // namespace co2::client

#endif  // CO2_CLIENT_TRAINING_FASHION_MNIST_H_
