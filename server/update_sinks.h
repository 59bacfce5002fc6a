// UpdateSinks: the sinks subscribed to one shard's updates (the Exchange
// streams), held weakly: a stream that ends simply stops receiving, and is
// forgotten the next time the live sinks are taken.
//
// Not thread-safe: the owner serialises calls (server::JobShard holds a
// mutex, and calls the sinks without it).
#ifndef CO2_SERVER_UPDATE_SINKS_H_
#define CO2_SERVER_UPDATE_SINKS_H_

#include <memory>
#include <vector>

#include "server/kept_update.h"
#include "server/update_chunks.h"

namespace co2::server {

// Receives the updates of every round that closes. Implemented by the Exchange
// streams; held weakly, so a stream that ends simply stops receiving.
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

#endif  // CO2_SERVER_UPDATE_SINKS_H_
