#include "common/fnv_hash.h"

#include <cstddef>

namespace co2::common {

uint64_t Fnv1a(absl::Span<const float> values, uint64_t hash) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  const size_t n = values.size() * sizeof(float);
  for (size_t i = 0; i < n; ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace co2::common
