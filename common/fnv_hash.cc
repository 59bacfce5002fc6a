#include "common/fnv_hash.h"

#include <cstddef>
#include <cstring>

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

uint64_t AnchorDigest(absl::Span<const float> values) {
  // FNV-1a's 64-bit parameters as published (the offset basis is
  // 0xcbf29ce484222325).
  constexpr uint64_t kPrime = 1099511628211ull;
  constexpr uint64_t kBasis = 14695981039346656037ull;
  constexpr size_t kLanes = 4;
  uint64_t lanes[kLanes] = {kBasis, kBasis, kBasis, kBasis};
  const char* bytes = reinterpret_cast<const char*>(values.data());
  const size_t n = values.size() * sizeof(float);
  const size_t words = n / 8;
  size_t i = 0;
  for (; i + kLanes <= words; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      uint64_t word;
      std::memcpy(&word, bytes + 8 * (i + j), 8);
      lanes[j] = (lanes[j] ^ word) * kPrime;
    }
  }
  for (; i < words; ++i) {
    uint64_t word;
    std::memcpy(&word, bytes + 8 * i, 8);
    lanes[i % kLanes] = (lanes[i % kLanes] ^ word) * kPrime;
  }
  if (n % 8 != 0) {
    uint64_t word = 0;
    std::memcpy(&word, bytes + 8 * words, n % 8);
    lanes[words % kLanes] = (lanes[words % kLanes] ^ word) * kPrime;
  }
  uint64_t hash = kBasis;
  for (const uint64_t lane : lanes) {
    for (int b = 0; b < 8; ++b) {
      hash ^= (lane >> (8 * b)) & 0xFF;
      hash *= kPrime;
    }
  }
  return hash;
}

}  // namespace co2::common
