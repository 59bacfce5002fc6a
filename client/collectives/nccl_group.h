// NcclGroup: the GPU backend of ProcessGroup. Owns one NCCL communicator
// and one CUDA stream on GroupOptions::device; data pointers are device
// pointers on that device (Broadcast also takes host memory, for control
// messages). Rank 0 creates the ncclUniqueId and publishes it
// through the group's file store (store_dir, prefix); the others wait for it
// within the timeout. One thread at a time (see process_group.h).
//
// The communicator is non-blocking: initialisation and every collective are
// polled until done or until the timeout, at which point the communicator
// is aborted (ncclCommAbort) and the group is broken. Each collective is
// complete on return (its stream is drained), so callers may reuse buffers.
// The group's stream is a blocking one: a collective starts after work the
// caller queued on the legacy default stream; work on other streams that
// writes `data` must be synchronised by the caller before the call.
//
// Built only when CMake finds CUDA and NCCL (target co2_nccl_group).
#ifndef CO2_CLIENT_COLLECTIVES_NCCL_GROUP_H_
#define CO2_CLIENT_COLLECTIVES_NCCL_GROUP_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/collectives/process_group.h"
#include "client/collectives/store.h"

// The handles behind ncclComm_t and cudaStream_t; their headers stay in the
// .cc file.
struct ncclComm;
struct CUstream_st;

namespace co2::client {

// Owns an ncclComm_t: ncclCommDestroy on destruction, unless Abort() ran.
class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm* comm) : comm_(comm) {}
  ~NcclComm();
  NcclComm(NcclComm&& other) noexcept;
  NcclComm& operator=(NcclComm&& other) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm* get() const { return comm_; }
  // ncclCommAbort now: stops in-flight work and frees the communicator.
  void Abort();

 private:
  void Destroy();
  ncclComm* comm_ = nullptr;
};

// Owns a cudaStream_t: cudaStreamDestroy on destruction.
class CudaStream {
 public:
  CudaStream() = default;
  explicit CudaStream(CUstream_st* stream) : stream_(stream) {}
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  CUstream_st* get() const { return stream_; }

 private:
  void Destroy();
  CUstream_st* stream_ = nullptr;
};

// A device buffer that grows to the largest size asked for: cudaFree on
// destruction.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  // At least `count` floats of device memory on the current device.
  absl::StatusOr<float*> Reserve(size_t count);

 private:
  float* data_ = nullptr;
  size_t count_ = 0;
};

class NcclGroup final : public ProcessGroup {
 public:
  // Rank 0 publishes NCCL's unique id in `store` (borrowed for the call),
  // the others read it there. FAILED_PRECONDITION "no CUDA device" when
  // CUDA sees no device; DEADLINE_EXCEEDED when the peers do not join within
  // options.timeout.
  static absl::StatusOr<std::unique_ptr<NcclGroup>> Create(
      const GroupOptions& options, Store* store);

  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // ncclAllReduce with ncclAvg. `data` is device memory on device().
  absl::Status AllReduceMean(float* data, size_t count) override;
  // ncclBroadcast in place. `data` is device memory on device(), or host
  // memory, which goes through a device buffer of the group's own (a copy
  // each way: for the few bytes of the node's control messages, not for
  // parameters).
  absl::Status Broadcast(float* data, size_t count, int root) override;

  int device() const { return device_; }

 private:
  NcclGroup(const GroupOptions& options, CudaStream stream, NcclComm comm);

  absl::Status CheckUsable() const;
  // Whether `data` is host memory (false: device memory on device());
  // INVALID_ARGUMENT for null data or another device's memory.
  absl::StatusOr<bool> IsHostMemory(absl::string_view what, const float* data,
                                    size_t count) const;
  absl::Status CheckDeviceBuffer(absl::string_view what, const float* data,
                                 size_t count) const;
  // ncclBroadcast of device memory on device().
  absl::Status BroadcastDevice(float* data, size_t count, int root);
  // Polls the communicator and the stream until the enqueued collective is
  // complete; aborts the communicator at the deadline.
  absl::Status WaitForCompletion(absl::string_view what);
  // Marks the group broken and returns `status`.
  absl::Status Fail(absl::Status status);

  const int rank_;
  const int size_;
  const int device_;
  const absl::Duration timeout_;
  CudaStream stream_;
  DeviceScratch scratch_;  // host Broadcasts' staging
  NcclComm comm_;  // Declared last: destroyed before the stream.
  absl::Status broken_;  // OK while usable.
};

}  // namespace co2::client

#endif  // CO2_CLIENT_COLLECTIVES_NCCL_GROUP_H_
