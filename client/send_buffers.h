// SendBuffers: the encoded chunks of a worker's contribution to one shard.
// The trainer encodes into them; the stream's writer lends each chunk to the
// message that sends it, without copying (client/worker_wire.h), and gRPC
// may hold that reference after the write returns, until the bytes are on
// the socket. Writable therefore never hands out a chunk that is still
// lent: it gives a fresh buffer in its place, and the lent one is freed with
// its last reference.
//
// Not synchronised: the owner (ShardStream) calls Writable only while no
// Lend can run (no contribution in flight); Lend may run on any thread
// otherwise, and the references it returns may be dropped on any thread.
#ifndef CO2_CLIENT_SEND_BUFFERS_H_
#define CO2_CLIENT_SEND_BUFFERS_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/codec.h"

namespace co2::client {

class SendBuffers {
 public:
  // The chunks of a shard of `elements` (common/layout.h), each sized for
  // `codec`.
  SendBuffers(common::Codec codec, size_t elements);

  size_t size() const { return chunks_.size(); }

  // Every chunk, to encode the next contribution into; valid until the next
  // call. A chunk lent and not yet released is replaced, not reused.
  std::vector<absl::Span<char>> Writable();

  // Chunk `i`, shared with whoever sends it.
  std::shared_ptr<const std::string> Lend(size_t i) const { return chunks_[i]; }

 private:
  std::vector<std::shared_ptr<std::string>> chunks_;
};

}  // namespace co2::client

#endif  // CO2_CLIENT_SEND_BUFFERS_H_
