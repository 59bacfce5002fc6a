// BroadcastFromRank and GatherFromRanks: one rank's small value, or every
// rank's, on every rank, through the one collective every backend has
// (Broadcast) of the value's bytes. For the agreement a node's local ranks
// reach when each exchanges its own slice (client/training/co2_optimizer.h):
// their start rounds, whether their updates arrived, how a boundary ended.
// Host memory, as the other control broadcasts of a node's group.
#ifndef CO2_CLIENT_COLLECTIVES_RANK_GATHER_H_
#define CO2_CLIENT_COLLECTIVES_RANK_GATHER_H_

#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "client/collectives/process_group.h"
#include "common/status_macros.h"

namespace co2::client {

// value ← rank `root`'s value, on every rank. Collective: every rank of
// `group` calls it with the same T and root. The bytes travel as they are
// (a broadcast copies them), so any trivially copyable T arrives bit for
// bit.
template <typename T>
absl::Status BroadcastFromRank(ProcessGroup& group, T& value, int root) {
  static_assert(std::is_trivially_copyable_v<T>);
  constexpr size_t kFloats = (sizeof(T) + sizeof(float) - 1) / sizeof(float);
  float bytes[kFloats] = {};
  std::memcpy(bytes, &value, sizeof(T));
  CO2_RETURN_IF_ERROR(group.Broadcast(bytes, kFloats, root));
  std::memcpy(&value, bytes, sizeof(T));
  return absl::OkStatus();
}

// Every rank's `mine`, in rank order (one BroadcastFromRank per rank).
template <typename T>
absl::StatusOr<std::vector<T>> GatherFromRanks(ProcessGroup& group,
                                               const T& mine) {
  std::vector<T> all(group.size(), mine);
  for (int root = 0; root < group.size(); ++root) {
    CO2_RETURN_IF_ERROR(BroadcastFromRank(group, all[root], root));
  }
  return all;
}

}  // namespace co2::client

#endif  // CO2_CLIENT_COLLECTIVES_RANK_GATHER_H_
