// How: a non-blocking NCCL communicator (ncclConfig_t::blocking = 0), so
// that no NCCL call can block past our deadline: init and collectives are
// enqueued, then ncclCommGetAsyncError and cudaStreamQuery are polled until
// both report completion, and ncclCommAbort ends the wait at the timeout.
// NcclStatus() and CudaStatus() are the one place where NCCL and CUDA
// results become absl::Status.
#include "client/collectives/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace co2::client {
namespace {

// Key of the unique id in the group's store (next to gloo's keys).
constexpr char kUniqueIdKey[] = "nccl_unique_id";
// Poll period while waiting for NCCL/CUDA work.
constexpr absl::Duration kPollPeriod = absl::Microseconds(50);

absl::Status NcclStatus(ncclResult_t result, absl::string_view what,
                        ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) return absl::OkStatus();
  const char* last = ncclGetLastError(comm);
  const std::string message = absl::StrCat(
      "NCCL ", what, ": ", ncclGetErrorString(result),
      last != nullptr && *last != '\0' ? absl::StrCat(" (", last, ")")
                                       : std::string());
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    case ncclInProgress:
      return absl::DeadlineExceededError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Clears the error unless it is sticky; a sticky one breaks the context
  // and surfaces again on the next call anyway.
  cudaGetLastError();
  const std::string message =
      absl::StrCat("CUDA ", what, ": ", cudaGetErrorName(error), ": ",
                   cudaGetErrorString(error));
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
      return absl::InvalidArgumentError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

// Polls until the non-blocking communicator has left ncclInProgress.
absl::Status AwaitCommReady(ncclComm_t comm, absl::Time deadline,
                            absl::string_view what) {
  while (true) {
    ncclResult_t state = ncclInProgress;
    CO2_RETURN_IF_ERROR(NcclStatus(ncclCommGetAsyncError(comm, &state),
                                   "ncclCommGetAsyncError", comm));
    if (state != ncclInProgress) return NcclStatus(state, what, comm);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("NCCL ", what, " did not complete in time"));
    }
    absl::SleepFor(kPollPeriod);
  }
}

}  // namespace

// ---- RAII handles ----------------------------------------------------------

NcclComm::~NcclComm() { Destroy(); }

NcclComm::NcclComm(NcclComm&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)) {}

NcclComm& NcclComm::operator=(NcclComm&& other) noexcept {
  if (this != &other) {
    Destroy();
    comm_ = std::exchange(other.comm_, nullptr);
  }
  return *this;
}

void NcclComm::Abort() {
  if (comm_ != nullptr) ncclCommAbort(std::exchange(comm_, nullptr));
}

void NcclComm::Destroy() {
  if (comm_ != nullptr) ncclCommDestroy(std::exchange(comm_, nullptr));
}

CudaStream::~CudaStream() { Destroy(); }

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    Destroy();
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void CudaStream::Destroy() {
  if (stream_ != nullptr) cudaStreamDestroy(std::exchange(stream_, nullptr));
}

// ---- DeviceScratch --------------------------------------------------------

DeviceScratch::~DeviceScratch() {
  if (data_ != nullptr) cudaFree(data_);
}

absl::StatusOr<float*> DeviceScratch::Reserve(size_t count) {
  if (count <= count_) return data_;
  if (data_ != nullptr) {
    cudaFree(data_);
    data_ = nullptr;
    count_ = 0;
  }
  void* data = nullptr;
  CO2_RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(&data, count * sizeof(float)),
                 absl::StrCat("cudaMalloc of ", count, " floats")));
  data_ = static_cast<float*>(data);
  count_ = count;
  return data_;
}

// ---- NcclGroup ------------------------------------------------------------

NcclGroup::NcclGroup(const GroupOptions& options, CudaStream stream,
                     NcclComm comm)
    : rank_(options.rank),
      size_(options.size),
      device_(options.device),
      timeout_(options.timeout),
      stream_(std::move(stream)),
      comm_(std::move(comm)) {}

NcclGroup::~NcclGroup() {
  if (comm_.get() == nullptr) return;
  cudaSetDevice(device_);
  // ncclCommDestroy would finalize (wait for every peer to quiesce) without
  // a deadline; finalize here under our deadline, abort when it fails. A
  // broken communicator may have peers that never return: do not wait.
  if (broken_.ok()) {
    const ncclResult_t finalize = ncclCommFinalize(comm_.get());
    if ((finalize == ncclSuccess || finalize == ncclInProgress) &&
        AwaitCommReady(comm_.get(), absl::Now() + timeout_, "finalize")
            .ok()) {
      return;  // comm_ now frees its local resources without blocking.
    }
  }
  comm_.Abort();
}

absl::StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::Create(
    const GroupOptions& options, Store* store) {
  CO2_RETURN_IF_ERROR(ValidateGroupOptions(options));
  if (store == nullptr) {
    return absl::InvalidArgumentError("NcclGroup::Create: no store");
  }
  const absl::Time deadline = absl::Now() + options.timeout;

  int device_count = 0;
  const absl::Status count_status =
      CudaStatus(cudaGetDeviceCount(&device_count), "cudaGetDeviceCount");
  if (!count_status.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: ", count_status.message()));
  }
  if (device_count == 0) {
    return absl::FailedPreconditionError(
        "no CUDA device: cudaGetDeviceCount returned 0");
  }
  if (options.device < 0 || options.device >= device_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", options.device, " is outside [0, ",
                     device_count, ")"));
  }
  CO2_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options.device),
                                 absl::StrCat("cudaSetDevice(", options.device,
                                              ")")));

  // A blocking stream: collectives are ordered after the work the caller
  // queued on the legacy default stream (e.g. the kernels and copies that
  // produced `data`).
  cudaStream_t raw_stream = nullptr;
  CO2_RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&raw_stream, cudaStreamDefault),
      "cudaStreamCreateWithFlags"));
  CudaStream stream(raw_stream);

  ncclUniqueId id;
  if (options.rank == 0) {
    CO2_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    CO2_RETURN_IF_ERROR(store->Set(
        kUniqueIdKey, std::string(id.internal, sizeof(id.internal))));
  } else {
    CO2_ASSIGN_OR_RETURN(const std::string bytes, store->WaitGet(kUniqueIdKey));
    if (bytes.size() != sizeof(id.internal)) {
      return absl::DataLossError(
          absl::StrCat("NCCL unique id from the group's store (",
                       options.store_dir, "/", options.prefix, ") has ",
                       bytes.size(), " bytes, want ", sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t raw_comm = nullptr;
  const ncclResult_t init = ncclCommInitRankConfig(
      &raw_comm, options.size, id, options.rank, &config);
  NcclComm comm(raw_comm);
  if (init != ncclInProgress) {
    CO2_RETURN_IF_ERROR(NcclStatus(init, "ncclCommInitRankConfig", raw_comm));
  }
  const absl::Status ready = AwaitCommReady(
      raw_comm, deadline,
      absl::StrCat("init of rank ", options.rank, "/", options.size));
  if (!ready.ok()) {
    comm.Abort();
    return ready;
  }
  return std::unique_ptr<NcclGroup>(
      new NcclGroup(options, std::move(stream), std::move(comm)));
}

absl::Status NcclGroup::CheckUsable() const {
  if (broken_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "NCCL group (rank ", rank_, "/", size_,
      ") is broken by an earlier failure: ", broken_.ToString()));
}

absl::StatusOr<bool> NcclGroup::IsHostMemory(absl::string_view what,
                                             const float* data,
                                             size_t count) const {
  if (data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": null data with count ", count));
  }
  cudaPointerAttributes attributes;
  CO2_RETURN_IF_ERROR(CudaStatus(cudaPointerGetAttributes(&attributes, data),
                                 "cudaPointerGetAttributes"));
  const bool on_device = attributes.type == cudaMemoryTypeDevice ||
                         attributes.type == cudaMemoryTypeManaged;
  if (!on_device) return true;
  if (attributes.device != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": data is device memory on device ", attributes.device,
        ", the group's is device ", device_));
  }
  return false;
}

absl::Status NcclGroup::CheckDeviceBuffer(absl::string_view what,
                                          const float* data,
                                          size_t count) const {
  CO2_ASSIGN_OR_RETURN(const bool host, IsHostMemory(what, data, count));
  if (host) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": data must be device memory on device ", device_,
        ", not host memory"));
  }
  return absl::OkStatus();
}

absl::Status NcclGroup::Fail(absl::Status status) {
  broken_ = status;
  return status;
}

absl::Status NcclGroup::WaitForCompletion(absl::string_view what) {
  const absl::Time deadline = absl::Now() + timeout_;
  // First the enqueue (non-blocking comms may still be issuing the kernel),
  // then the kernel itself.
  absl::Status status = AwaitCommReady(comm_.get(), deadline, what);
  while (status.ok()) {
    const cudaError_t query = cudaStreamQuery(stream_.get());
    if (query == cudaSuccess) break;
    if (query != cudaErrorNotReady) {
      status = CudaStatus(query, absl::StrCat(what, ": cudaStreamQuery"));
      break;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_.get(), &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      status = NcclStatus(async, what, comm_.get());
      break;
    }
    if (absl::Now() >= deadline) {
      status = absl::DeadlineExceededError(absl::StrCat(
          "NCCL ", what, " did not complete within ",
          absl::FormatDuration(timeout_)));
      break;
    }
    absl::SleepFor(kPollPeriod);
  }
  if (!status.ok()) {
    comm_.Abort();  // Unblocks the stream; the group cannot be reused.
    return Fail(status);
  }
  return absl::OkStatus();
}

absl::Status NcclGroup::AllReduceMean(float* data, size_t count) {
  CO2_RETURN_IF_ERROR(CheckUsable());
  if (count == 0) return absl::OkStatus();
  CO2_RETURN_IF_ERROR(CheckDeviceBuffer("AllReduceMean", data, count));
  CO2_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  const ncclResult_t result = ncclAllReduce(
      data, data, count, ncclFloat, ncclAvg, comm_.get(), stream_.get());
  if (result != ncclInProgress) {
    const absl::Status status =
        NcclStatus(result, "ncclAllReduce", comm_.get());
    if (!status.ok()) {
      comm_.Abort();
      return Fail(status);
    }
  }
  return WaitForCompletion("allreduce");
}

absl::Status NcclGroup::Broadcast(float* data, size_t count, int root) {
  CO2_RETURN_IF_ERROR(CheckUsable());
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Broadcast: root ", root, " is outside [0, ", size_, ")"));
  }
  if (count == 0) return absl::OkStatus();
  CO2_ASSIGN_OR_RETURN(const bool host, IsHostMemory("Broadcast", data, count));
  CO2_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  if (!host) return BroadcastDevice(data, count, root);
  CO2_ASSIGN_OR_RETURN(float* staged, scratch_.Reserve(count));
  const size_t bytes = count * sizeof(float);
  CO2_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(staged, data, bytes, cudaMemcpyHostToDevice,
                      stream_.get()),
      "Broadcast: copy to the device"));
  CO2_RETURN_IF_ERROR(BroadcastDevice(staged, count, root));
  // The broadcast is complete: the copy back does not wait on peers.
  CO2_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(data, staged, bytes, cudaMemcpyDeviceToHost,
                      stream_.get()),
      "Broadcast: copy to the host"));
  return CudaStatus(cudaStreamSynchronize(stream_.get()),
                    "Broadcast: copy to the host");
}

absl::Status NcclGroup::BroadcastDevice(float* data, size_t count, int root) {
  const ncclResult_t result = ncclBroadcast(data, data, count, ncclFloat, root,
                                            comm_.get(), stream_.get());
  if (result != ncclInProgress) {
    const absl::Status status =
        NcclStatus(result, "ncclBroadcast", comm_.get());
    if (!status.ok()) {
      comm_.Abort();
      return Fail(status);
    }
  }
  return WaitForCompletion("broadcast");
}

}  // namespace co2::client
