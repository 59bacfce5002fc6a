#include "apps/co2-train/worker_checkpoint.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/training/torch_status.h"

namespace co2::client {
namespace {

torch::Tensor ToTensor(const std::vector<float>& values) {
  return torch::from_blob(const_cast<float*>(values.data()),
                          {static_cast<int64_t>(values.size())}, torch::kFloat)
      .clone();
}

std::vector<float> FromTensor(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(),
                            c.data_ptr<float>() + c.numel());
}

}  // namespace

std::string WorkerCheckpointPath(const std::string& dir, int worker) {
  return absl::StrCat(dir, "/worker-", worker, ".pt");
}

std::string RankCheckpointPath(const std::string& dir, int worker,
                               int local_rank) {
  return absl::StrCat(dir, "/worker-", worker, "-rank-", local_rank, ".pt");
}

absl::Status SaveWorkerCheckpoint(const std::string& path,
                                  const std::string& job,
                                  const WorkerCheckpoint& checkpoint,
                                  const torch::optim::Optimizer& inner) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  try {
    torch::serialize::OutputArchive archive;
    archive.write("job", c10::IValue(job));
    archive.write("round", c10::IValue(static_cast<int64_t>(checkpoint.round)));
    archive.write("steps", c10::IValue(static_cast<int64_t>(checkpoint.steps)));
    archive.write("slice_begin",
                  c10::IValue(static_cast<int64_t>(checkpoint.slice.begin)));
    archive.write("slice_end",
                  c10::IValue(static_cast<int64_t>(checkpoint.slice.end)));
    archive.write("local_ranks",
                  c10::IValue(static_cast<int64_t>(checkpoint.local_ranks)));
    archive.write("shards",
                  c10::IValue(static_cast<int64_t>(checkpoint.shards)));
    archive.write("params", ToTensor(checkpoint.params));
    archive.write("anchor", ToTensor(checkpoint.anchor));
    archive.write("residual", ToTensor(checkpoint.residual));
    archive.write("start_offset", ToTensor(checkpoint.start_offset));
    archive.write("last_delta", ToTensor(checkpoint.last_delta));
    torch::serialize::OutputArchive state;
    inner.save(state);
    archive.write("inner", state);
    archive.save_to(tmp);
  } catch (...) {
    return absl::Status(absl::StatusCode::kDataLoss,
                        absl::StrCat("writing the worker checkpoint ", tmp,
                                     ": ",
                                     TorchExceptionToStatus("save").message()));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot rename ", tmp, " to ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerCheckpoint> LoadWorkerCheckpoint(
    const std::string& path, const std::string& job,
    torch::optim::Optimizer& inner) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("no worker checkpoint at ", path,
                     " (--resume needs the --checkpoint_dir of a run that "
                     "saved one: at every round boundary)"));
  }
  WorkerCheckpoint c;
  std::string saved_job;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    c10::IValue value;
    archive.read("job", value);
    saved_job = value.toStringRef();
    archive.read("round", value);
    c.round = static_cast<uint64_t>(value.toInt());
    archive.read("steps", value);
    c.steps = static_cast<uint64_t>(value.toInt());
    // A file without a layout is a leader's, of the whole model.
    if (archive.try_read("local_ranks", value)) {
      c.local_ranks = static_cast<uint32_t>(value.toInt());
      archive.read("shards", value);
      c.shards = static_cast<uint32_t>(value.toInt());
      archive.read("slice_begin", value);
      c.slice.begin = static_cast<uint64_t>(value.toInt());
      archive.read("slice_end", value);
      c.slice.end = static_cast<uint64_t>(value.toInt());
    }
    torch::Tensor t;
    archive.read("params", t);
    c.params = FromTensor(t);
    if (c.local_ranks == 0) c.slice = {0, c.params.size()};
    archive.read("anchor", t);
    c.anchor = FromTensor(t);
    archive.read("residual", t);
    c.residual = FromTensor(t);
    archive.read("start_offset", t);
    c.start_offset = FromTensor(t);
    archive.read("last_delta", t);
    c.last_delta = FromTensor(t);
    if (saved_job == job) {
      torch::serialize::InputArchive state;
      archive.read("inner", state);
      inner.load(state);
    }
  } catch (...) {
    return absl::DataLossError(
        absl::StrCat(path, " is not a co2-train worker checkpoint: ",
                     TorchExceptionToStatus("load").message()));
  }
  if (saved_job != job) {
    return absl::DataLossError(absl::StrCat(path, " is a checkpoint of job \"",
                                            saved_job, "\", not of \"", job,
                                            "\""));
  }
  return c;
}

}  // namespace co2::client
