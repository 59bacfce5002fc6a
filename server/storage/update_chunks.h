// UpdateChunks: the encoded outer update of one closed round, as the chunk
// messages that carry it (server/job/update_messages.h makes them).
// Immutable once built and shared by everything that holds or sends it (the
// shard's cache, its checkpoint, every stream), so any thread may read it.
#ifndef CO2_SERVER_STORAGE_UPDATE_CHUNKS_H_
#define CO2_SERVER_STORAGE_UPDATE_CHUNKS_H_

#include <memory>
#include <vector>

#include "co2/v1/aggregator.pb.h"

namespace co2::server {

// The chunks of one round's outer update, shared by every stream sending them.
using UpdateChunks = std::vector<std::shared_ptr<const v1::OuterUpdate>>;

}  // namespace co2::server

#endif  // CO2_SERVER_STORAGE_UPDATE_CHUNKS_H_
