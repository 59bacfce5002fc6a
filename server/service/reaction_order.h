#ifndef CO2_SERVER_SERVICE_REACTION_ORDER_H_
#define CO2_SERVER_SERVICE_REACTION_ORDER_H_

// Tells ThreadSanitizer the order that gRPC's callback API guarantees
// between a reactor's steps: an operation started on one thread (the
// constructor's or a reaction's StartRead, StartWrite or Finish, also from
// the poller or a ReadThread) happens before the reaction that completes it,
// and every step happens before OnDone. gRPC keeps that order with its
// completion queue, inside Debian's uninstrumented libgrpc where TSan cannot
// see it (tests/run_tsan.sh); without these edges TSan reports a reactor's
// members, written in one step and read in the next, as races. Each is a
// no-op unless the build is instrumented with -fsanitize=thread.
// Stateless; any thread may call them.

namespace co2::server {

// Right before starting an operation on `reactor` whose completion runs a
// reaction or OnDone (StartRead, StartWrite, Finish).
void ReactionOrderStarting(const void* reactor);

// First thing in each reaction of `reactor` (OnReadDone, OnWriteDone,
// OnDone).
void ReactionOrderReacting(const void* reactor);

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_REACTION_ORDER_H_
