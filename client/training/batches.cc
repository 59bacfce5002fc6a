#include "client/training/batches.h"

#include <torch/torch.h>

#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/training/torch_status.h"

namespace co2::client {

absl::StatusOr<Batch> MakeFashionMnistBatch(
    const FashionMnistExamples& examples, absl::Span<const int64_t> indices) {
  for (const int64_t index : indices) {
    if (index < 0 || index >= examples.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "example index ", index, " outside [0, ", examples.size(), ")"));
    }
  }
  // One lookup per pixel instead of a subtract and divide.
  std::array<float, 256> normalized;
  for (int v = 0; v < 256; ++v) {
    normalized[v] = (v / 255.0f - kFashionMnistMean) / kFashionMnistStd;
  }
  const int64_t batch_size = static_cast<int64_t>(indices.size());
  try {
    Batch batch;
    batch.input = torch::empty(
        {batch_size, 1, kFashionMnistRows, kFashionMnistCols}, torch::kFloat);
    batch.target = torch::empty({batch_size}, torch::kLong);
    float* pixels = batch.input.data_ptr<float>();
    int64_t* labels = batch.target.data_ptr<int64_t>();
    for (int64_t b = 0; b < batch_size; ++b) {
      const uint8_t* image =
          examples.images.data() + indices[b] * kFashionMnistPixels;
      for (int p = 0; p < kFashionMnistPixels; ++p) {
        pixels[b * kFashionMnistPixels + p] = normalized[image[p]];
      }
      labels[b] = examples.labels[indices[b]];
    }
    return batch;
  } catch (...) {
    return TorchExceptionToStatus("fashion-mnist batch");
  }
}

absl::StatusOr<Batch> MakeCharLmBatch(absl::Span<const uint8_t> windows,
                                      int64_t seq_len) {
  if (seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len must be >= 1, got ", seq_len));
  }
  const int64_t window = seq_len + 1;
  if (static_cast<int64_t>(windows.size()) % window != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(windows.size(), " bytes are not whole windows of ", window,
                     " (seq_len + 1)"));
  }
  const int64_t batch_size = static_cast<int64_t>(windows.size()) / window;
  try {
    Batch batch;
    batch.input = torch::empty({batch_size, seq_len}, torch::kLong);
    batch.target = torch::empty({batch_size, seq_len}, torch::kLong);
    int64_t* input = batch.input.data_ptr<int64_t>();
    int64_t* target = batch.target.data_ptr<int64_t>();
    for (int64_t b = 0; b < batch_size; ++b) {
      const uint8_t* w = windows.data() + b * window;
      for (int64_t t = 0; t < seq_len; ++t) {
        input[b * seq_len + t] = w[t];
        target[b * seq_len + t] = w[t + 1];
      }
    }
    return batch;
  } catch (...) {
    return TorchExceptionToStatus("charlm batch");
  }
}

}  // namespace co2::client
