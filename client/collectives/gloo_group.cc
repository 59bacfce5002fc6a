// How: one gloo::rendezvous::Context connected as a full mesh of TCP pairs
// on GroupOptions::address. Collectives use gloo's new-style API
// (gloo::allreduce and gloo::broadcast with per-call tag and timeout). gloo
// reports every failure, timeouts and dead peers included, by throwing;
// CallGloo() below is the only place that turns those exceptions into
// absl::Status.
#include "client/collectives/gloo_group.h"

#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/context.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"

namespace co2::client {
namespace {

// gloo signals a timeout with an IoException whose text says so ("Timed out
// waiting ...", "Wait timeout for key(s)", "Read timeout", ...); anything
// else on the wire means the peer or the connection is gone.
absl::Status IoExceptionToStatus(absl::string_view what,
                                 absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  if (absl::StrContains(lower, "timeout") ||
      absl::StrContains(lower, "timed out")) {
    return absl::DeadlineExceededError(
        absl::StrCat("gloo ", what, " timed out: ", message));
  }
  return absl::UnavailableError(
      absl::StrCat("gloo ", what, " failed (peer gone?): ", message));
}

// Runs `fn`, which calls into gloo, and converts whatever it throws.
template <typename Fn>
absl::Status CallGloo(absl::string_view what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const ::gloo::IoException& e) {
    return IoExceptionToStatus(what, e.what());
  } catch (const ::gloo::InvalidOperationException& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo ", what, ": invalid operation: ", e.what()));
  } catch (const ::gloo::EnforceNotMet& e) {
    return absl::InternalError(
        absl::StrCat("gloo ", what, ": assertion failed: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("gloo ", what, ": ", e.what()));
  } catch (...) {
    return absl::UnknownError(
        absl::StrCat("gloo ", what, ": unknown exception"));
  }
}

// gloo's FileStore::wait compares whole elapsed seconds with the timeout,
// so it overshoots a deadline by up to 1 s; this one keeps to the deadline
// within one poll period. (gloo's own wait polls too: files give no event.)
class DeadlineFileStore : public ::gloo::rendezvous::FileStore {
 public:
  using FileStore::FileStore;
  using FileStore::wait;

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    constexpr std::chrono::milliseconds kPollPeriod(5);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!check(keys)) {
      if (timeout != ::gloo::kNoTimeout &&
          std::chrono::steady_clock::now() >= deadline) {
        throw ::gloo::IoException(
            absl::StrCat("Wait timeout for key(s) [", absl::StrJoin(keys, ", "),
                         "] after ", timeout.count(), " ms"));
      }
      std::this_thread::sleep_for(kPollPeriod);
    }
  }
};

std::chrono::milliseconds ToGlooTimeout(absl::Duration timeout) {
  // gloo treats 0 as "no timeout"; never pass it by rounding down.
  return std::max(absl::ToChronoMilliseconds(timeout),
                  std::chrono::milliseconds(1));
}

absl::Status EnsureStoreDir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (!std::filesystem::is_directory(dir)) {
    return absl::FailedPreconditionError(
        absl::StrCat("store_dir '", dir, "' is not a usable directory: ",
                     error ? error.message() : "not a directory"));
  }
  return absl::OkStatus();
}

// See the header: a dead peer must fail the collective, not kill us.
void IgnoreSigpipeIfDefault() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if (current.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

}  // namespace

GlooGroup::GlooGroup(int rank, int size, absl::Duration timeout,
                     std::shared_ptr<::gloo::Context> context)
    : rank_(rank),
      size_(size),
      timeout_(timeout),
      context_(std::move(context)) {}

GlooGroup::~GlooGroup() = default;

absl::StatusOr<std::unique_ptr<GlooGroup>> GlooGroup::Create(
    const GroupOptions& options) {
  CO2_RETURN_IF_ERROR(ValidateGroupOptions(options));
  CO2_RETURN_IF_ERROR(EnsureStoreDir(options.store_dir));
  IgnoreSigpipeIfDefault();

  std::shared_ptr<::gloo::rendezvous::Context> context;
  CO2_RETURN_IF_ERROR(CallGloo(
      absl::StrCat("rendezvous of rank ", options.rank, "/", options.size,
                   " in ", options.store_dir, "/", options.prefix),
      [&] {
        ::gloo::transport::tcp::attr attr;
        attr.hostname = options.address;
        attr.ai_family = AF_INET;
        std::shared_ptr<::gloo::transport::Device> device =
            ::gloo::transport::tcp::CreateDevice(attr);
        DeadlineFileStore file_store(options.store_dir);
        ::gloo::rendezvous::PrefixStore store(options.prefix, file_store);
        context = std::make_shared<::gloo::rendezvous::Context>(options.rank,
                                                                options.size);
        context->setTimeout(ToGlooTimeout(options.timeout));
        context->connectFullMesh(store, device);
      }));
  return std::unique_ptr<GlooGroup>(new GlooGroup(
      options.rank, options.size, options.timeout, std::move(context)));
}

absl::Status GlooGroup::CheckUsable() const {
  if (broken_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "gloo group (rank ", rank_, "/", size_,
      ") is broken by an earlier failure: ", broken_.ToString()));
}

absl::Status GlooGroup::Fail(absl::Status status) {
  broken_ = status;
  // Peers blocked on this rank see the closed sockets and fail now rather
  // than at their own deadline.
  CallGloo("close", [&] { context_->closeConnections(); }).IgnoreError();
  return status;
}

absl::Status GlooGroup::AllReduceMean(float* data, size_t count) {
  CO2_RETURN_IF_ERROR(CheckUsable());
  if (count == 0) return absl::OkStatus();
  if (data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllReduceMean: null data with count ", count));
  }
  if (size_ == 1) return absl::OkStatus();

  const absl::Status status = CallGloo("allreduce", [&] {
    ::gloo::AllreduceOptions options(context_);
    options.setOutput(data, count);
    options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &::gloo::sum<float>));
    options.setTag(NextTag());
    options.setTimeout(ToGlooTimeout(timeout_));
    ::gloo::allreduce(options);
  });
  if (!status.ok()) return Fail(status);

  // Division, not multiplication by 1/size: the quotient is correctly
  // rounded, so an exactly representable mean comes out exact.
  const float divisor = static_cast<float>(size_);
  for (size_t i = 0; i < count; ++i) data[i] /= divisor;
  return absl::OkStatus();
}

absl::Status GlooGroup::Broadcast(float* data, size_t count, int root) {
  CO2_RETURN_IF_ERROR(CheckUsable());
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Broadcast: root ", root, " is outside [0, ", size_, ")"));
  }
  if (count == 0) return absl::OkStatus();
  if (data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: null data with count ", count));
  }
  if (size_ == 1) return absl::OkStatus();

  const absl::Status status = CallGloo("broadcast", [&] {
    ::gloo::BroadcastOptions options(context_);
    options.setOutput(data, count);
    options.setRoot(root);
    options.setTag(NextTag());
    options.setTimeout(ToGlooTimeout(timeout_));
    ::gloo::broadcast(options);
  });
  if (!status.ok()) return Fail(status);
  return absl::OkStatus();
}

namespace {

class GlooFileStore final : public Store {
 public:
  explicit GlooFileStore(GroupOptions options) : options_(std::move(options)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return CallGloo(absl::StrCat("file store set '", key, "'"), [&] {
      DeadlineFileStore file_store(options_.store_dir);
      ::gloo::rendezvous::PrefixStore store(options_.prefix, file_store);
      store.set(key, std::vector<char>(value.begin(), value.end()));
    });
  }

  absl::StatusOr<std::string> WaitGet(const std::string& key) override {
    std::string value;
    CO2_RETURN_IF_ERROR(
        CallGloo(absl::StrCat("file store wait for '", key, "'"), [&] {
          DeadlineFileStore file_store(options_.store_dir);
          ::gloo::rendezvous::PrefixStore store(options_.prefix, file_store);
          store.wait({key}, ToGlooTimeout(options_.timeout));
          const std::vector<char> bytes = store.get(key);
          value.assign(bytes.begin(), bytes.end());
        }));
    return value;
  }

 private:
  const GroupOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> OpenFileStore(
    const GroupOptions& options) {
  CO2_RETURN_IF_ERROR(ValidateGroupOptions(options));
  CO2_RETURN_IF_ERROR(EnsureStoreDir(options.store_dir));
  return std::unique_ptr<Store>(new GlooFileStore(options));
}

}  // namespace co2::client
