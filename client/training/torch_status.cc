#include "client/training/torch_status.h"

#include <c10/util/Exception.h>

#include <exception>
#include <new>

#include "absl/strings/str_cat.h"

namespace co2::client {

absl::Status TorchExceptionToStatus(absl::string_view context) {
  if (std::current_exception() == nullptr) {  // `throw;` would terminate
    return absl::InternalError(
        absl::StrCat(context, ": TorchExceptionToStatus outside a catch"));
  }
  // Rethrowing is the only portable way to classify the exception in flight
  // from a catch (...) block.
  try {
    throw;
  } catch (const c10::NotImplementedError& e) {
    return absl::UnimplementedError(
        absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    // what() carries a multi-line C++ backtrace; the short form is what a
    // user needs in a log line.
    return absl::InvalidArgumentError(
        absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const std::bad_alloc& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(context, ": out of memory (", e.what(), ")"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(context, ": unknown exception"));
  }
}

}  // namespace co2::client
