// Status propagation macros. Abseil 20220623 ships no RETURN_IF_ERROR, so
// the project defines its two macros here, once. Header only; any thread.
#ifndef CO2_COMMON_STATUS_MACROS_H_
#define CO2_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CO2_STATUS_CONCAT_INNER_(a, b) a##b
#define CO2_STATUS_CONCAT_(a, b) CO2_STATUS_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function if it is not OK.
#define CO2_RETURN_IF_ERROR(expr)                \
  do {                                           \
    const ::absl::Status co2_status_ = (expr);   \
    if (!co2_status_.ok()) return co2_status_;   \
  } while (false)

// `lhs = value of expr`, or returns its status from the enclosing function.
#define CO2_ASSIGN_OR_RETURN(lhs, expr) \
  CO2_ASSIGN_OR_RETURN_IMPL_(CO2_STATUS_CONCAT_(co2_statusor_, __LINE__), lhs, expr)

#define CO2_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                               \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()

#endif  // CO2_COMMON_STATUS_MACROS_H_
