// Converts the exception in flight inside a catch (...) block that guards
// LibTorch calls into an absl::Status, so that the data and model units share
// one mapping from torch's error model to ours. Torch-free header; any thread.
//
//   try {
//     ...torch calls...
//   } catch (...) {
//     return TorchExceptionToStatus("forward");
//   }
#ifndef CO2_CLIENT_TRAINING_TORCH_STATUS_H_
#define CO2_CLIENT_TRAINING_TORCH_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace co2::client {

// Must be called while an exception is being handled. `context` (what was
// being done) prefixes the message. Mapping:
//   c10::NotImplementedError        -> UNIMPLEMENTED
//   other c10::Error (shape, dtype,
//   index, value errors: TORCH_CHECK) -> INVALID_ARGUMENT
//   std::bad_alloc, out of memory     -> RESOURCE_EXHAUSTED
//   any other exception               -> INTERNAL
// The message is torch's text without its C++ backtrace.
absl::Status TorchExceptionToStatus(absl::string_view context);

}  // namespace co2::client

#endif  // CO2_CLIENT_TRAINING_TORCH_STATUS_H_
