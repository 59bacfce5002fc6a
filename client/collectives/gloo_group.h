// GlooGroup: the CPU backend of ProcessGroup. Owns a gloo context whose
// pairs are TCP connections on GroupOptions::address (loopback unless the
// group spans hosts or network namespaces); ranks find each other
// through gloo's FileStore in GroupOptions::store_dir under the group's
// prefix. Host pointers only. One thread at a time (see process_group.h).
//
// This file (with gloo_group.cc) is the one place where gloo is called and
// where its exceptions become absl::Status; it also opens the same file
// store as a Store (store.h) for other backends (the NCCL unique id), so
// that they need not touch gloo.
//
// Creating a group sets SIGPIPE to SIG_IGN when it is still SIG_DFL: gloo
// writes to sockets with writev(), so a peer that died would otherwise kill
// this process instead of failing the collective.
#ifndef CO2_CLIENT_COLLECTIVES_GLOO_GROUP_H_
#define CO2_CLIENT_COLLECTIVES_GLOO_GROUP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/collectives/process_group.h"
#include "client/collectives/store.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace co2::client {

class GlooGroup final : public ProcessGroup {
 public:
  // Rendezvous and connect the full mesh, within options.timeout.
  static absl::StatusOr<std::unique_ptr<GlooGroup>> Create(
      const GroupOptions& options);

  ~GlooGroup() override;
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Ring all-reduce (sum), then division by size(): for integer-valued
  // inputs the result is the exact, correctly rounded mean.
  absl::Status AllReduceMean(float* data, size_t count) override;
  absl::Status Broadcast(float* data, size_t count, int root) override;

 private:
  GlooGroup(int rank, int size, absl::Duration timeout,
            std::shared_ptr<::gloo::Context> context);

  // OK, or FAILED_PRECONDITION once a collective has failed.
  absl::Status CheckUsable() const;
  // Records a failed collective: marks the group broken and closes its
  // connections so that peers blocked on this rank fail fast too.
  absl::Status Fail(absl::Status status);
  uint32_t NextTag() { return next_tag_++; }

  const int rank_;
  const int size_;
  const absl::Duration timeout_;
  std::shared_ptr<::gloo::Context> context_;
  // Collectives are issued in the same order on every rank, so the tags
  // agree without communication.
  uint32_t next_tag_ = 0;
  absl::Status broken_;  // OK while usable.
};

// The file store GlooGroup rendezvous in (options.store_dir, under
// options.prefix) as a Store whose waits end after options.timeout.
absl::StatusOr<std::unique_ptr<Store>> OpenFileStore(
    const GroupOptions& options);

}  // namespace co2::client

#endif  // CO2_CLIENT_COLLECTIVES_GLOO_GROUP_H_
