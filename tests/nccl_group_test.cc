// NcclGroup / CreateProcessGroup(kNccl). CUDA cannot be used across
// fork() once initialised, so the test process itself never touches CUDA:
// every CUDA-using body (even the device probe) runs in a forked child that
// reports through its exit code (0 = pass) and explains failures on stderr.
// GPU tests skip without a device; without one, creating a group must fail
// with FAILED_PRECONDITION.
#include "client/collectives/nccl_group.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/collectives/process_group.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/temp_dir.h"

namespace co2::client {
namespace {

using ::co2::testing::TempDir;

using ::testing::Each;
using ::testing::Eq;

constexpr int kPass = 0;
constexpr int kCreateFailed = 10;
constexpr int kCallFailed = 11;
constexpr int kWrongValue = 12;
constexpr int kWrongCode = 15;
constexpr int kCudaFailed = 16;

#define CHILD_CHECK(cond, code, ...)                                     \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "[child %d] %s:%d: %s\n", getpid(), __FILE__, \
                   __LINE__, absl::StrCat(__VA_ARGS__).c_str());         \
      return (code);                                                     \
    }                                                                    \
  } while (false)

// Runs body(rank) in one forked child per rank; exit codes, or 1000 + signal.
std::vector<int> RunRanks(int n, const std::function<int(int)>& body) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < n; ++rank) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(120);  // A hang ends as SIGALRM.
      _exit(body(rank));
    }
    pids.push_back(pid);
  }
  std::vector<int> results;
  for (pid_t pid : pids) {
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
      results.push_back(-1);
    } else if (WIFEXITED(status)) {
      results.push_back(WEXITSTATUS(status));
    } else {
      results.push_back(1000 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
    }
  }
  return results;
}

// Number of CUDA devices, asked in a child so that this process stays
// CUDA-free (0 when the runtime or driver fails).
int ProbeDeviceCount() {
  static const int count = [] {
    const std::vector<int> result = RunRanks(1, [](int) {
      int n = 0;
      if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
      return n > 100 ? 100 : n;
    });
    return result[0] >= 0 && result[0] <= 100 ? result[0] : 0;
  }();
  return count;
}

GroupOptions MakeOptions(const std::string& dir, int rank, int size) {
  GroupOptions options;
  options.backend = Backend::kNccl;
  options.rank = rank;
  options.size = size;
  options.store_dir = dir;
  options.prefix = "nccl";
  options.timeout = absl::Seconds(60);
  options.device = rank;
  return options;
}

float Pattern(size_t i) { return static_cast<float>(i % 1000); }

// Device buffer with RAII free.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t count) : count(count) {
    if (cudaMalloc(&data, count * sizeof(float)) != cudaSuccess) data = nullptr;
  }
  ~DeviceBuffer() {
    if (data != nullptr) cudaFree(data);
  }
  float* data = nullptr;
  size_t count;
};

int Upload(const std::vector<float>& host, DeviceBuffer& device) {
  CHILD_CHECK(device.data != nullptr, kCudaFailed, "cudaMalloc failed");
  CHILD_CHECK(cudaMemcpy(device.data, host.data(), host.size() * sizeof(float),
                         cudaMemcpyHostToDevice) == cudaSuccess,
              kCudaFailed, "upload failed");
  return kPass;
}

int Download(const DeviceBuffer& device, std::vector<float>& host) {
  host.resize(device.count);
  CHILD_CHECK(cudaMemcpy(host.data(), device.data, host.size() * sizeof(float),
                         cudaMemcpyDeviceToHost) == cudaSuccess,
              kCudaFailed, "download failed");
  return kPass;
}

// rank k holds k + Pattern(i); the mean is (N-1)/2 + Pattern(i), exact for
// N in {1, 2} whether NCCL scales before or after summing.
int AllReduceAndCheck(ProcessGroup& group, size_t count) {
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = group.rank() + Pattern(i);
  DeviceBuffer buffer(count);
  if (int code = Upload(host, buffer); code != kPass) return code;
  const absl::Status status = group.AllReduceMean(buffer.data, count);
  CHILD_CHECK(status.ok(), kCallFailed, "AllReduceMean: ", status.ToString());
  if (int code = Download(buffer, host); code != kPass) return code;
  const float base = (group.size() - 1) / 2.0f;
  for (size_t i = 0; i < count; ++i) {
    CHILD_CHECK(host[i] == base + Pattern(i), kWrongValue, "rank ",
                group.rank(), " element ", i, " = ", host[i], ", want ",
                base + Pattern(i));
  }
  return kPass;
}

int BroadcastAndCheck(ProcessGroup& group, size_t count, int root) {
  auto root_value = [root](size_t i) { return 0.5f * (i % 1000) + 7 + root; };
  std::vector<float> host(count, -1.0f - group.rank());
  if (group.rank() == root) {
    for (size_t i = 0; i < count; ++i) host[i] = root_value(i);
  }
  DeviceBuffer buffer(count);
  if (int code = Upload(host, buffer); code != kPass) return code;
  const absl::Status status = group.Broadcast(buffer.data, count, root);
  CHILD_CHECK(status.ok(), kCallFailed, "Broadcast: ", status.ToString());
  if (int code = Download(buffer, host); code != kPass) return code;
  for (size_t i = 0; i < count; ++i) {
    CHILD_CHECK(host[i] == root_value(i), kWrongValue, "rank ", group.rank(),
                " element ", i, " = ", host[i], ", want ", root_value(i));
  }
  return kPass;
}

// The same with host memory (a control message), which the group stages
// through device memory; rank k starts with garbage of its own.
int HostBroadcastAndCheck(ProcessGroup& group, size_t count, int root) {
  auto root_value = [root](size_t i) { return 3.0f * (i % 97) - 5 - root; };
  std::vector<float> host(count, 100.0f + group.rank());
  if (group.rank() == root) {
    for (size_t i = 0; i < count; ++i) host[i] = root_value(i);
  }
  const absl::Status status = group.Broadcast(host.data(), count, root);
  CHILD_CHECK(status.ok(), kCallFailed, "Broadcast of host memory: ",
              status.ToString());
  for (size_t i = 0; i < count; ++i) {
    CHILD_CHECK(host[i] == root_value(i), kWrongValue, "rank ", group.rank(),
                " host element ", i, " = ", host[i], ", want ", root_value(i));
  }
  return kPass;
}

TEST(NcclGroup, WithoutDeviceCreateIsFailedPrecondition) {
  if (ProbeDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  TempDir dir;
  const std::string path = dir.path();
  const std::vector<int> codes = RunRanks(1, [&](int rank) {
    const auto group = CreateProcessGroup(MakeOptions(path, rank, 1));
    CHILD_CHECK(absl::IsFailedPrecondition(group.status()), kWrongCode,
                group.status().ToString());
    CHILD_CHECK(absl::StrContains(group.status().message(), "no CUDA device"),
                kWrongCode, group.status().ToString());
    return kPass;
  });
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

TEST(NcclGroup, OneRankAllReduceAndBroadcast) {
  if (ProbeDeviceCount() < 1) GTEST_SKIP() << "no CUDA device";
  TempDir dir;
  const std::string path = dir.path();
  const std::vector<int> codes = RunRanks(1, [&](int rank) {
    auto group = CreateProcessGroup(MakeOptions(path, rank, 1));
    CHILD_CHECK(group.ok(), kCreateFailed, group.status().ToString());
    int code = AllReduceAndCheck(**group, 1031);
    if (code != kPass) return code;
    code = AllReduceAndCheck(**group, (size_t{1} << 20) + 3);
    if (code != kPass) return code;
    code = BroadcastAndCheck(**group, 777, 0);
    if (code != kPass) return code;
    code = HostBroadcastAndCheck(**group, 3, 0);
    if (code != kPass) return code;
    // Misuse is rejected before NCCL sees it.
    std::vector<float> host(4, 1.0f);
    const absl::Status host_pointer = (*group)->AllReduceMean(host.data(), 4);
    CHILD_CHECK(absl::IsInvalidArgument(host_pointer), kWrongCode,
                host_pointer.ToString());
    DeviceBuffer buffer(4);
    const absl::Status bad_root = (*group)->Broadcast(buffer.data, 4, 1);
    CHILD_CHECK(absl::IsInvalidArgument(bad_root), kWrongCode,
                bad_root.ToString());
    // Still usable after rejected calls.
    return AllReduceAndCheck(**group, 8);
  });
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

TEST(NcclGroup, TwoRanksOnTwoDevices) {
  if (ProbeDeviceCount() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  TempDir dir;
  const std::string path = dir.path();
  const std::vector<int> codes = RunRanks(2, [&](int rank) {
    if (cudaSetDevice(rank) != cudaSuccess) return kCudaFailed;
    auto group = CreateProcessGroup(MakeOptions(path, rank, 2));
    CHILD_CHECK(group.ok(), kCreateFailed, group.status().ToString());
    int code = AllReduceAndCheck(**group, (size_t{1} << 20) + 3);
    if (code != kPass) return code;
    code = BroadcastAndCheck(**group, 4099, /*root=*/1);
    if (code != kPass) return code;
    // A small control message, then a larger one (the staging grows).
    code = HostBroadcastAndCheck(**group, 2, /*root=*/1);
    if (code != kPass) return code;
    return HostBroadcastAndCheck(**group, 5000, /*root=*/0);
  });
  EXPECT_THAT(codes, Each(Eq(kPass))) << absl::StrJoin(codes, ",");
}

}  // namespace
}  // namespace co2::client
