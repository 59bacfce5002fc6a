// minimal_trainer: a LibTorch loop trained with CO2 against running
// co2-aggregator shards, built out of tree against the installed co2 package.
//   minimal_trainer HOST:PORT[,HOST:PORT...] [WORKER_ID] [ROUNDS] [DATA_DIR]
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "co2/client/training/batches.h"
#include "co2/client/training/co2_optimizer.h"
#include "co2/client/training/fashion_mnist.h"
#include "co2/common/job_config.h"

namespace cc = co2::client;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "minimal_trainer: %s\n", s.ToString().c_str());
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 2)
    return Fail(absl::InvalidArgumentError(
        "usage: minimal_trainer HOST:PORT [WORKER] [ROUNDS] [DATA_DIR]"));
  const std::string worker = argc > 2 ? argv[2] : "worker-0";
  const int rounds = argc > 3 ? std::stoi(argv[3]) : 5, tau = 8, batch = 32;
  auto data = cc::LoadFashionMnist(
      {argc > 4 ? argv[4] : "/usr/share/datasets/fashion-mnist"});
  if (!data.ok()) return Fail(data.status());

  torch::manual_seed(1);  // every worker starts from the same A_0
  torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(784, 128),
                              torch::nn::ReLU(), torch::nn::Linear(128, 10));
  // (1) Re-home the parameters into one flat buffer, then build the optimizer.
  auto flat = cc::FlatParams::Create(model->parameters());
  if (!flat.ok()) return Fail(flat.status());
  torch::optim::AdamW inner(model->parameters(),
                            torch::optim::AdamWOptions(1e-3));
  // (2) Join the job on the aggregator shards; (3) wrap the inner optimizer.
  cc::ClientOptions client;
  client.addresses = std::vector<std::string>(absl::StrSplit(argv[1], ','));
  client.job = "minimal";
  client.worker_id = worker;
  client.job_config = co2::common::DefaultJobConfig(0, 0);  // α, β, Λ, clip
  client.job_config.set_tau(tau);
  client.job_config.set_rounds(rounds);  // the job finishes after them
  auto connected = cc::AggregatorClient::Connect(client, (*flat)->ParamSpan());
  if (!connected.ok()) return Fail(connected.status());
  cc::Co2OptimizerOptions options;
  options.tau = tau;
  options.rounds =
      rounds;  // the job's rounds: the last update is owed to every worker
  options.samples_per_step = batch;
  // Left unset, apply and carry_progress are co2-train's defaults: the
  // update is applied when it arrives, and until then each worker carries
  // its own progress (docs/defaults.md).
  auto co2 = cc::Co2Optimizer::Create(options, flat->get(), &inner,
                                      std::move(*connected), nullptr, nullptr);
  if (!co2.ok()) return Fail(co2.status());
  std::printf("co2: apply %s, carry_progress %s\n",
              std::string(cc::ApplyAtName((*co2)->apply())).c_str(),
              (*co2)->carry_progress() ? "true" : "false");

  const size_t offset = std::hash<std::string>()(worker) % 50000;
  for (int step = 0; step < rounds * tau; ++step) {
    std::vector<int64_t> indices;
    for (int i = 0; i < batch; ++i)
      indices.push_back((offset + step * batch + i) % 60000);
    auto b = cc::MakeFashionMnistBatch(data->train, indices);
    if (!b.ok()) return Fail(b.status());
    (*co2)->ZeroGrad();  // (4) instead of inner.zero_grad()
    torch::Tensor loss = torch::cross_entropy_loss(model->forward(b->input), b->target);
    loss.backward();
    if (absl::Status s = (*co2)->Step(); !s.ok()) return Fail(s);  // (5) instead of inner.step()
    if ((step + 1) % tau == 0) std::printf("round %d loss %.4f\n", (step + 1) / tau, loss.item<float>());
  }
  if (absl::Status s = (*co2)->Finish(); !s.ok()) return Fail(s);  // (6) the final anchor
  std::printf("done: %llu steps, exposed communication %.3f s\n",
              static_cast<unsigned long long>((*co2)->steps()),
              absl::ToDoubleSeconds((*co2)->total_exposed_comm()));
  return 0;
}
