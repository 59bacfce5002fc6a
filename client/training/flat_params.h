// FlatParams: re-homes a module's parameters into one contiguous fp32 buffer
// (and their gradients into a second one), so that the outer step, the codecs
// and the collectives each run as one vectorised pass over one buffer.
//
// After Create, every parameter's data is a view of params() and every
// gradient (of a parameter that requires one) is a view of grads(); the
// module, any optimizer built on the same tensors and autograd keep working
// unchanged. Autograd accumulates into an existing gradient in place, so the
// gradient views survive backward(); an optimizer or Module::zero_grad that
// replaces a gradient tensor is repaired by RebindGrads(), which the caller
// runs before it reads grads().
//
// Owns the two flat buffers; the parameters are borrowed (they share the
// buffers' storage). Not thread-safe: one training thread.
#ifndef CO2_CLIENT_TRAINING_FLAT_PARAMS_H_
#define CO2_CLIENT_TRAINING_FLAT_PARAMS_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace co2::client {

class FlatParams {
 public:
  // Copies each parameter into the flat buffer (in the given order) and makes
  // it a view. All parameters must be dense, contiguous-able float32 tensors
  // on one device; INVALID_ARGUMENT names the first one that is not.
  static absl::StatusOr<std::unique_ptr<FlatParams>> Create(
      std::vector<at::Tensor> params);

  FlatParams(const FlatParams&) = delete;
  FlatParams& operator=(const FlatParams&) = delete;

  int64_t numel() const { return numel_; }
  // The flat 1-D parameter and gradient buffers (same device as the params).
  const at::Tensor& params() const { return params_; }
  const at::Tensor& grads() const { return grads_; }
  // The re-homed parameters, in order.
  const std::vector<at::Tensor>& tensors() const { return tensors_; }

  // Host views of the buffers; the buffers must live on the CPU.
  absl::Span<float> ParamSpan();
  absl::Span<float> GradSpan();

  // Makes every gradient a view of grads() again: a gradient that was reset
  // is zeroed in place, one that was replaced by a new tensor is copied back
  // into its slice. Returns how many gradients had to be repaired.
  int RebindGrads();
  // Zeroes grads() in one pass (and rebinds).
  void ZeroGrads();

  // Bytes of the two flat buffers (2 · 4 · numel).
  size_t BytesHeld() const;

 private:
  FlatParams() = default;

  int64_t numel_ = 0;
  at::Tensor params_;
  at::Tensor grads_;
  std::vector<at::Tensor> tensors_;
  std::vector<int64_t> offsets_;     // element offset of each tensor
  std::vector<bool> has_grad_;       // requires_grad at Create
};

}  // namespace co2::client

#endif  // CO2_CLIENT_TRAINING_FLAT_PARAMS_H_
