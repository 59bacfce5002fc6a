// Store: the key/value rendezvous a process-group backend uses to exchange a
// blob at start-up (NCCL's unique id), as c10d's Store. GlooGroup's file store
// (OpenFileStore in gloo_group.h) is the one implementation; a backend takes
// a Store and never touches gloo.
//
// Implementations are safe to use from one thread at a time.
#ifndef CO2_CLIENT_COLLECTIVES_STORE_H_
#define CO2_CLIENT_COLLECTIVES_STORE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace co2::client {

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value` for every rank of the group.
  virtual absl::Status Set(const std::string& key,
                           const std::string& value) = 0;
  // Waits, up to the store's deadline, for `key` and returns its value;
  // DEADLINE_EXCEEDED when it does not appear in time.
  virtual absl::StatusOr<std::string> WaitGet(const std::string& key) = 0;
};

}  // namespace co2::client

#endif  // CO2_CLIENT_COLLECTIVES_STORE_H_
