#include "client/training/flat_params.h"

#include <torch/torch.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/training/torch_status.h"

namespace co2::client {
namespace {

// A tensor that shares `flat`'s storage at `offset` with `sizes`, made with
// set_ rather than narrow/view so that it carries no autograd view metadata:
// optimizers call detach_() on gradients, which a differentiable view forbids.
at::Tensor AliasOf(const at::Tensor& flat, int64_t offset,
                   at::IntArrayRef sizes) {
  at::Tensor out = at::empty({0}, flat.options());
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= sizes[i];
  }
  out.set_(flat.storage(), flat.storage_offset() + offset, sizes, strides);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FlatParams>> FlatParams::Create(
    std::vector<at::Tensor> params) {
  if (params.empty()) {
    return absl::InvalidArgumentError("FlatParams: no parameters");
  }
  try {
    const at::Device device = params[0].device();
    int64_t total = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (!p.defined()) {
        return absl::InvalidArgumentError(
            absl::StrCat("FlatParams: parameter ", i, " is undefined"));
      }
      if (p.is_sparse() || p.scalar_type() != at::kFloat) {
        return absl::InvalidArgumentError(absl::StrCat(
            "FlatParams: parameter ", i, " must be a dense float32 tensor, is ",
            std::string(c10::toString(p.scalar_type())),
            p.is_sparse() ? " (sparse)" : ""));
      }
      if (p.device() != device) {
        return absl::InvalidArgumentError(
            absl::StrCat("FlatParams: parameter ", i, " is on ",
                         p.device().str(), ", parameter 0 on ", device.str()));
      }
      total += p.numel();
    }
    std::unique_ptr<FlatParams> flat(new FlatParams());
    torch::NoGradGuard no_grad;
    const auto options = torch::TensorOptions().dtype(at::kFloat).device(device);
    flat->numel_ = total;
    flat->params_ = torch::empty({total}, options);
    flat->grads_ = torch::zeros({total}, options);
    int64_t offset = 0;
    for (at::Tensor& p : params) {
      const int64_t n = p.numel();
      at::Tensor slot = AliasOf(flat->params_, offset, p.sizes());
      slot.copy_(p.detach());
      p.set_data(slot);
      const bool has_grad = p.requires_grad();
      if (has_grad) {
        at::Tensor g = AliasOf(flat->grads_, offset, p.sizes());
        if (p.grad().defined()) g.copy_(p.grad());
        p.mutable_grad() = g;
      }
      flat->offsets_.push_back(offset);
      flat->has_grad_.push_back(has_grad);
      offset += n;
    }
    flat->tensors_ = std::move(params);
    return flat;
  } catch (...) {
    return TorchExceptionToStatus("FlatParams::Create");
  }
}

absl::Span<float> FlatParams::ParamSpan() {
  return absl::Span<float>(params_.data_ptr<float>(), numel_);
}

absl::Span<float> FlatParams::GradSpan() {
  return absl::Span<float>(grads_.data_ptr<float>(), numel_);
}

int FlatParams::RebindGrads() {
  torch::NoGradGuard no_grad;
  int repaired = 0;
  float* base = grads_.data_ptr<float>();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!has_grad_[i]) continue;
    at::Tensor& p = tensors_[i];
    const at::Tensor& g = p.grad();
    if (g.defined() && g.data_ptr() == base + offsets_[i] &&
        g.sizes() == p.sizes() && g.is_contiguous()) {
      continue;
    }
    at::Tensor slot = AliasOf(grads_, offsets_[i], p.sizes());
    if (g.defined()) {
      slot.copy_(g);
    } else {
      slot.zero_();
    }
    p.mutable_grad() = slot;
    ++repaired;
  }
  return repaired;
}

void FlatParams::ZeroGrads() {
  RebindGrads();
  torch::NoGradGuard no_grad;
  grads_.zero_();
}

size_t FlatParams::BytesHeld() const {
  return 2 * sizeof(float) * static_cast<size_t>(numel_);
}

}  // namespace co2::client
