// The instruction sets that the streaming kernels (common/codec.cc,
// server/job/outer_optimizer.cc) are compiled for, and which one runs. Each
// kernel is built once per instruction set from the same source, with the same
// operations in the same order and no FMA, so every variant computes the same
// bits: a job may mix machines with and without AVX2. The best one this CPU
// supports is picked once per process; tests pin one per thread with
// ScopedKernelIsaForTesting. Header-only; any thread.
#ifndef CO2_COMMON_KERNEL_ISA_H_
#define CO2_COMMON_KERNEL_ISA_H_

#include <string_view>
#include <vector>

// Code between CO2_BEGIN_AVX2 and CO2_END_AVX2 is compiled for AVX2, which
// does not include FMA (GCC and clang spell this differently).
// clang-format off
#if defined(__clang__)
#define CO2_BEGIN_AVX2 _Pragma( \
    "clang attribute push(__attribute__((target(\"avx2\"))), apply_to = function)")
#define CO2_END_AVX2 _Pragma("clang attribute pop")
#else
#define CO2_BEGIN_AVX2 _Pragma("GCC push_options") _Pragma("GCC target(\"avx2\")")
#define CO2_END_AVX2 _Pragma("GCC pop_options")
#endif
// clang-format on

namespace co2::common {

// kPortable: plain C++ and GCC vector types (what non-x86 machines run);
// kSse2: x86-64 baseline with SSE2 intrinsics; kAvx2: 32-byte vectors.
enum class KernelIsa { kPortable, kSse2, kAvx2 };

inline std::string_view KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kPortable:
      return "portable";
    case KernelIsa::kSse2:
      return "sse2";
    case KernelIsa::kAvx2:
      return "avx2";
  }
  return "unknown";
}

// The variants this build has and this CPU runs, portable first, best last.
inline std::vector<KernelIsa> SupportedKernelIsas() {
  std::vector<KernelIsa> isas = {KernelIsa::kPortable};
#if defined(__x86_64__) && defined(__GNUC__)
  isas.push_back(KernelIsa::kSse2);
  // Also checks that the OS saves the YMM registers.
  if (__builtin_cpu_supports("avx2")) isas.push_back(KernelIsa::kAvx2);
#endif
  return isas;
}

namespace kernel_isa_internal {
// Set only by ScopedKernelIsaForTesting, on its own thread.
inline thread_local const KernelIsa* pinned = nullptr;
}  // namespace kernel_isa_internal

// The variant the kernels dispatch to on this thread.
inline KernelIsa ActiveKernelIsa() {
  static const KernelIsa best = SupportedKernelIsas().back();
  const KernelIsa* pinned = kernel_isa_internal::pinned;
  return pinned != nullptr ? *pinned : best;
}

// While alive, kernels called on this thread run the `isa` variant, which
// must be one of SupportedKernelIsas().
class ScopedKernelIsaForTesting {
 public:
  explicit ScopedKernelIsaForTesting(KernelIsa isa)
      : isa_(isa), previous_(kernel_isa_internal::pinned) {
    kernel_isa_internal::pinned = &isa_;
  }
  ~ScopedKernelIsaForTesting() { kernel_isa_internal::pinned = previous_; }
  ScopedKernelIsaForTesting(const ScopedKernelIsaForTesting&) = delete;
  ScopedKernelIsaForTesting& operator=(const ScopedKernelIsaForTesting&) =
      delete;

 private:
  const KernelIsa isa_;
  const KernelIsa* const previous_;
};

}  // namespace co2::common

#endif  // CO2_COMMON_KERNEL_ISA_H_
