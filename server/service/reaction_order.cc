#include "server/service/reaction_order.h"

#include "absl/base/config.h"

#ifdef ABSL_HAVE_THREAD_SANITIZER
#include <sanitizer/tsan_interface.h>
#endif

namespace co2::server {

// A release and an acquire on the reactor's address: everything a thread
// did before starting an operation is ordered before whatever a later
// reaction of the same reactor does.
void ReactionOrderStarting(const void* reactor) {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  __tsan_release(const_cast<void*>(reactor));
#else
  (void)reactor;
#endif
}

void ReactionOrderReacting(const void* reactor) {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  __tsan_acquire(const_cast<void*>(reactor));
#else
  (void)reactor;
#endif
}

}  // namespace co2::server
