// Wire frames: the protobuf encoding of the Exchange stream's messages,
// written and read by hand around their payload, so that serialisation never
// copies it. Both ends use it: the shard for the updates it sends and the
// contributions it reads (server/service/exchange_wire.h), the worker for the
// contributions it sends and the updates it reads (client/worker_wire.h).
//
// - FrameWithPayload: a message whose last field is its payload, as a
//   ByteBuffer of two slices, the serialised head and the payload itself,
//   aliased and kept alive by a reference to its owner until gRPC is done.
// - TakeSlices: a received message's slices, and views of their bytes.
// - WireReader: reads wire format from those views in place; a
//   length-delimited field (a payload) comes back as views too.
//
// Pure functions and a value type; any thread.
#ifndef CO2_COMMON_WIRE_FRAMES_H_
#define CO2_COMMON_WIRE_FRAMES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace co2::common {

// The tag and length that open a length-delimited field `field` of `size`
// bytes, appended to `out`.
void AppendLengthDelimitedHeader(int field, size_t size, std::string* out);
// How many bytes AppendLengthDelimitedHeader appends.
size_t LengthDelimitedHeaderSize(int field, size_t size);

// `head` (every field before the payload, serialised) followed by `payload`
// as the length-delimited field `payload_field`. The payload is not copied:
// its slice aliases it and holds `owner`, which must keep it alive and
// unchanged, until gRPC releases the slice. An empty payload is left out, as
// protobuf leaves out an empty bytes field.
// `tail`, the serialised fields numbered above the payload's, follows it.
grpc::ByteBuffer FrameWithPayload(std::string head, int payload_field,
                                  std::string_view payload,
                                  std::shared_ptr<const void> owner,
                                  std::string tail = {});

// Moves the slices out of `buffer` (leaving it empty) into `slices`, and
// views of their bytes into `pieces`. The views point into the slices'
// storage: moving the vector keeps them valid, copying or resizing it does
// not. False if gRPC could not read the buffer.
bool TakeSlices(grpc::ByteBuffer* buffer, std::vector<grpc::Slice>* slices,
                std::vector<std::string_view>* pieces);

// Reads protobuf wire format from a sequence of byte pieces, in place.
// Every method returns false on truncated or malformed input.
class WireReader {
 public:
  explicit WireReader(std::vector<std::string_view> pieces);

  bool done() const { return remaining_ == 0; }

  // The next field's number and wire type.
  bool ReadTag(int* field, int* wire_type);
  bool ReadVarint(uint64_t* value);
  bool ReadFixed64(uint64_t* value);
  // A length-delimited value, as views into the pieces.
  bool ReadLengthDelimited(std::vector<std::string_view>* out);
  // Skips the value of a field of `wire_type` (groups are not supported).
  bool Skip(int wire_type);

 private:
  bool ReadByte(uint8_t* byte);
  // The next `n` bytes, as views into the pieces.
  bool Take(uint64_t n, std::vector<std::string_view>* out);

  std::vector<std::string_view> pieces_;
  size_t index_ = 0;   // the piece being read
  size_t offset_ = 0;  // in it
  uint64_t remaining_ = 0;
};

}  // namespace co2::common

#endif  // CO2_COMMON_WIRE_FRAMES_H_
