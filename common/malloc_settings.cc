#include "common/malloc_settings.h"

#include <malloc.h>

namespace co2::common {

void KeepLargeBuffersInHeap() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

}  // namespace co2::common
