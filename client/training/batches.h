// Turns the torch-free data sets (fashion_mnist.h, char_corpus.h) into
// training tensors. Batches are built on the CPU; the caller moves them to
// its device. Stateless functions; any thread.
#ifndef CO2_CLIENT_TRAINING_BATCHES_H_
#define CO2_CLIENT_TRAINING_BATCHES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/training/fashion_mnist.h"

namespace co2::client {

struct Batch {
  at::Tensor input;
  at::Tensor target;  // int64 class ids
};

// Fashion-MNIST training-set pixel statistics (of x/255), the usual
// normalisation constants for this data set.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// input: float [B, 1, 28, 28] = (pixel/255 - mean) / std; target: int64 [B].
// B = indices.size() (may be 0). INVALID_ARGUMENT for an index outside
// [0, examples.size()).
absl::StatusOr<Batch> MakeFashionMnistBatch(
    const FashionMnistExamples& examples, absl::Span<const int64_t> indices);

// From windows of seq_len + 1 bytes (WindowSampler::Sample):
// input int64 [B, T] = bytes 0..T-1, target int64 [B, T] = bytes 1..T.
// INVALID_ARGUMENT when seq_len < 1 or the size is not a multiple of
// seq_len + 1.
absl::StatusOr<Batch> MakeCharLmBatch(absl::Span<const uint8_t> windows,
                                      int64_t seq_len);

}  // namespace co2::client

#endif  // CO2_CLIENT_TRAINING_BATCHES_H_
