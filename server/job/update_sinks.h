// UpdateSinks: the sinks subscribed to one shard's updates (the Exchange
// streams), held weakly: a stream that ends simply stops receiving, and is
// forgotten the next time the live sinks are taken.
//
// UpdateSinks is not thread-safe: the owner (server::JobShard) serialises
// calls under its mutex.
#ifndef CO2_SERVER_JOB_UPDATE_SINKS_H_
#define CO2_SERVER_JOB_UPDATE_SINKS_H_

#include <memory>
#include <vector>

#include "server/storage/kept_update.h"
#include "server/storage/update_chunks.h"

namespace co2::server {

// Receives the updates of every round that closes. Implemented by the Exchange
// streams; held weakly, so a stream that ends simply stops receiving.
//
// The one lock rule: a sink's methods only queue what they are given. They
// never block, never read a file and never call into the shard, because
// JobShard::Subscribe calls them with the shard's mutex held (so that nothing
// published later overtakes the replay); the poller's publishing calls them
// without it.
class UpdateSink {
 public:
  virtual ~UpdateSink() = default;
  // Chunks of an update, as they are made: a closed round's, or some of the
  // open round's (streamed ahead of its close).
  virtual void Send(std::shared_ptr<const UpdateChunks> update) = 0;
  // A whole update of a round the stream's worker missed (when it starts).
  virtual void Replay(const KeptUpdate& update) = 0;
};

class UpdateSinks {
 public:
  void Add(std::weak_ptr<UpdateSink> sink);
  // The sinks still alive, in the order they were added; the others are
  // dropped.
  std::vector<std::shared_ptr<UpdateSink>> Live();

 private:
  std::vector<std::weak_ptr<UpdateSink>> sinks_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_UPDATE_SINKS_H_
