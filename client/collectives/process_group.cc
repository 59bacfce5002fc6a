// The factory: picks the backend. NCCL is compiled in only when the build
// found CUDA and NCCL (CO2_HAVE_NCCL).
#include "client/collectives/process_group.h"

#include <memory>
#include <utility>

#include "client/collectives/gloo_group.h"
#include "common/status_macros.h"

#ifdef CO2_HAVE_NCCL
#include "client/collectives/nccl_group.h"
#endif

namespace co2::client {

absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateProcessGroup(
    const GroupOptions& options) {
  CO2_RETURN_IF_ERROR(ValidateGroupOptions(options));
  switch (options.backend) {
    case Backend::kGloo: {
      CO2_ASSIGN_OR_RETURN(std::unique_ptr<GlooGroup> group,
                           GlooGroup::Create(options));
      return std::unique_ptr<ProcessGroup>(std::move(group));
    }
    case Backend::kNccl: {
#ifdef CO2_HAVE_NCCL
      // NCCL's unique id travels through the file store Gloo uses.
      CO2_ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                           OpenFileStore(options));
      CO2_ASSIGN_OR_RETURN(std::unique_ptr<NcclGroup> group,
                           NcclGroup::Create(options, store.get()));
      return std::unique_ptr<ProcessGroup>(std::move(group));
#else
      return absl::UnimplementedError(
          "NCCL backend requested but co2 was built without NCCL");
#endif
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend ", static_cast<int>(options.backend)));
}

}  // namespace co2::client
