// ProcessGroup: processes that run collectives together, as c10d's process
// groups do: the L local processes of one worker every inner step (an
// in-place mean all-reduce of the gradients, a broadcast of the anchor from
// the local leader), every rank of a ddp job, or the workers' leaders at a
// job's start.
// It is torch-free: it works on raw float buffers (host memory for Gloo,
// device memory for NCCL) that the caller owns and keeps alive for the call.
//
// Every call is collective: all ranks of the group must issue the same
// calls, with the same counts, in the same order. A group is used by one
// thread at a time. Every call (and the rendezvous in CreateProcessGroup)
// ends within GroupOptions::timeout: a peer that died or never came yields
// an error, not a hang. After a failed collective the group is broken (the
// transport is in an unknown state) and every later call returns
// FAILED_PRECONDITION; recreate the group under a new prefix.
#ifndef CO2_CLIENT_COLLECTIVES_PROCESS_GROUP_H_
#define CO2_CLIENT_COLLECTIVES_PROCESS_GROUP_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace co2::client {

enum class Backend {
  kGloo,  // CPU collectives over TCP (GroupOptions::address); host pointers.
  kNccl,  // GPU collectives; device pointers on GroupOptions::device.
};

struct GroupOptions {
  // Which collective library runs the group.
  Backend backend = Backend::kGloo;
  // This process's rank in [0, size).
  int rank = 0;
  // Number of processes in the group (local ranks of the node).
  int size = 1;
  // Node-local directory for the rendezvous files; created if missing.
  std::string store_dir;
  // Group name: groups sharing store_dir need distinct prefixes, and a
  // prefix must not be reused within one store_dir (stale keys would be
  // read). No '/'.
  std::string prefix = "co2";
  // Deadline of the rendezvous and of every collective.
  absl::Duration timeout = absl::Seconds(60);
  // Gloo: the IPv4 address this rank's pairs listen on and advertise to its
  // peers. Loopback for ranks of one node; a group spanning hosts or network
  // namespaces (ddp's global group, the co2 leaders' barrier) gives each
  // rank the address of its own interface.
  std::string address = "127.0.0.1";
  // CUDA device ordinal used by the NCCL backend.
  int device = 0;
};

// The collective seam; implemented by GlooGroup and NcclGroup.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[0, count) ← mean over ranks of data[0, count), in place. Every rank
  // ends with the same (bit-identical) values.
  virtual absl::Status AllReduceMean(float* data, size_t count) = 0;

  // data[0, count) ← root's data[0, count) on every rank.
  virtual absl::Status Broadcast(float* data, size_t count, int root) = 0;
};

// Checks the fields every backend relies on; INVALID_ARGUMENT otherwise.
inline absl::Status ValidateGroupOptions(const GroupOptions& options) {
  if (options.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("group size must be >= 1, got ", options.size));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", options.rank, " is outside [0, ", options.size, ")"));
  }
  if (options.store_dir.empty()) {
    return absl::InvalidArgumentError("store_dir is empty");
  }
  if (options.prefix.empty() || options.prefix.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix must be non-empty and contain no '/', got '",
                     options.prefix, "'"));
  }
  if (options.timeout <= absl::ZeroDuration() ||
      options.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout must be positive and finite, got ",
                     absl::FormatDuration(options.timeout)));
  }
  return absl::OkStatus();
}

// Rendezvous with the other ranks and connect. Returns INVALID_ARGUMENT for
// bad options, DEADLINE_EXCEEDED when peers do not arrive within the
// timeout, UNIMPLEMENTED for kNccl in a build without NCCL, and
// FAILED_PRECONDITION for kNccl on a machine without a CUDA device.
absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateProcessGroup(
    const GroupOptions& options);

}  // namespace co2::client

#endif  // CO2_CLIENT_COLLECTIVES_PROCESS_GROUP_H_
