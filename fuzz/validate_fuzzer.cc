// libFuzzer target over everything a shard does with bytes from the network
// before they can touch its state: parsing the request messages, the
// validation the service runs (JobConfig validation and comparison, the
// registry's limits, JobShard::Join / SeedChunk / Contribute / Fetch), the
// codecs' Validate + Decode + AccumulateDecoded, and closing rounds with the
// outer step on whatever was accepted.
//
// Input: byte 0 picks the mode (and a few knobs); the rest is a serialised
// JoinRequest, ExchangeRequest or AnchorChunk, a sequence of structured
// contribution records, or a raw codec payload. Each input runs on a fresh
// small job (deterministic); only the registry of mode kJoin persists, to
// exercise its limits.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "co2/v1/aggregator.pb.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "server/job/job_registry.h"
#include "server/job/job_shard.h"

namespace co2 {
namespace {

constexpr uint64_t kParams = 2000;  // one chunk: cheap to create per input

enum Mode : uint8_t {
  kJoin = 0,
  kExchange = 1,
  kAnchorChunk = 2,
  kRecords = 3,
  kCodec = 4,
  kModes = 5,
};

v1::JobConfig BaseConfig(uint8_t knobs) {
  v1::JobConfig c = common::DefaultJobConfig(kParams, 1);
  c.set_downlink_codec(v1::Codec(1 + knobs % 3));
  c.set_min_workers(2);
  c.set_max_staleness((knobs >> 2) & 1);
  c.set_gap_penalty(v1::GapPenalty(1 + (knobs >> 3) % 3));
  c.set_clip(v1::Clip(1 + (knobs >> 5) % 3));
  return c;
}

// A stream that discards what it is sent.
class NullSink : public server::UpdateSink {
 public:
  void Send(std::shared_ptr<const server::UpdateChunks>) override {}
  void Replay(const server::KeptUpdate&) override {}
};

common::FakeClock* Clock() {
  static common::FakeClock* clock = new common::FakeClock();
  return clock;
}

// A fresh job with two members, w0 (which seeded it) and w1, whose uplink
// codecs come from `knobs`.
std::unique_ptr<server::JobShard> FreshJob(uint8_t knobs, bool seed = true) {
  server::JobShardOptions options;
  options.max_workers = 4;
  options.max_rejected_chunks = 3;
  const v1::JobConfig config = BaseConfig(knobs);
  auto job = server::JobShard::Create("fuzz", config, options, Clock());
  if (!job.ok()) __builtin_trap();  // the base config is valid
  (void)(*job)->Join("w0", config, common::Codec(1 + knobs % 3));
  (void)(*job)->Join("w1", config, common::Codec(1 + (knobs >> 1) % 3));
  if (seed) {
    std::string zeros(kParams * sizeof(float), '\0');
    if (!(*job)->SeedChunk("w0", 0, 0, zeros).ok()) __builtin_trap();
  }
  return *std::move(job);
}

// Closes what can close and reads the anchor back out, as Fetch does.
void Drain(server::JobShard& job) {
  job.Poll();
  (void)job.Fetch("w1");
}

void FuzzJoin(const std::string& bytes, uint8_t knobs) {
  v1::JoinRequest request;
  if (!request.ParseFromString(bytes)) return;
  // The registry persists across inputs (its limits are part of the target);
  // the poller sleeps, rounds never close there.
  static server::JobRegistry* registry = [] {
    server::JobRegistryOptions options;
    options.max_jobs = 4;
    options.max_parameters = 1 << 16;
    options.shard.max_workers = 8;
    options.max_poll_interval = absl::Hours(1);
    return new server::JobRegistry(options, Clock());
  }();
  absl::StatusOr<common::Codec> uplink =
      common::CodecFromWire(request.uplink_codec());
  (void)common::ValidateJobConfig(request.config());
  (void)common::CheckSameJobConfig(BaseConfig(knobs), request.config());
  (void)common::DescribeJobConfig(request.config());
  if (!uplink.ok() || request.job().empty() || request.job().size() > 128 ||
      request.worker_id().empty() || request.worker_id().size() > 128) {
    return;  // what the service rejects before the registry
  }
  const v1::JobConfig config = registry->WithDefaults(request.config());
  auto job = registry->GetOrCreate(request.job(), config);
  if (job.ok()) (void)(*job)->Join(request.worker_id(), config, *uplink);
  // And against a job of the same shape, where a matching config joins.
  auto fresh = FreshJob(knobs);
  (void)fresh->Join(request.worker_id(), request.config(), *uplink);
}

void FuzzExchange(const std::string& bytes, uint8_t knobs) {
  v1::ExchangeRequest request;
  if (!request.ParseFromString(bytes)) return;
  auto job = FreshJob(knobs);
  if (request.has_open()) {
    (void)job->UplinkCodec(request.open().worker_id());
    (void)job->Subscribe(std::make_shared<NullSink>(),
                   request.open().replay_from_round());
    return;
  }
  if (!request.has_contribution()) return;
  // Both members send it: a valid chunk completes the round.
  (void)job->Contribute("w0", request.contribution());
  (void)job->Contribute("w1", request.contribution());
  Drain(*job);
}

void FuzzAnchorChunk(const std::string& bytes, uint8_t knobs) {
  v1::AnchorChunk chunk;
  if (!chunk.ParseFromString(bytes)) return;
  auto job = FreshJob(knobs, /*seed=*/false);
  const std::string& seeder = (knobs & 1) ? chunk.worker_id() : "w0";
  (void)job->SeedChunk(seeder, chunk.chunk_index(), chunk.anchor_round(),
                        chunk.payload());
  (void)job->Fetch("w1");
}

// Records: [flags][weight: 4 bytes][round][chunk][length: 2 bytes][payload].
// flags bit 0: worker, bits 1-2: codec, bit 3: poll after it.
void FuzzRecords(const uint8_t* data, size_t size, uint8_t knobs) {
  auto job = FreshJob(knobs);
  size_t at = 0;
  while (size - at >= 9) {
    const uint8_t flags = data[at];
    float weight;
    std::memcpy(&weight, data + at + 1, sizeof(weight));
    v1::Contribution c;
    c.set_weight(weight);
    c.set_round(data[at + 5] % 8);
    c.set_chunk_index(data[at + 6] % 2);
    c.set_codec(v1::Codec((flags >> 1) & 3));
    size_t length = data[at + 7] | (size_t{data[at + 8]} << 8);
    at += 9;
    if (length > size - at) length = size - at;
    c.set_payload(std::string(reinterpret_cast<const char*>(data + at), length));
    at += length;
    (void)job->Contribute((flags & 1) ? "w1" : "w0", c);
    if (flags & 8) Drain(*job);
  }
  Drain(*job);
}

void FuzzCodec(const std::string& bytes, uint8_t knobs) {
  const common::Codec codec = common::Codec(1 + knobs % 3);
  // The element count the payload would have to encode, and one off it.
  size_t elements = 0;
  switch (codec) {
    case common::Codec::kFp32:
      elements = bytes.size() / 4;
      break;
    case common::Codec::kBf16:
      elements = bytes.size() / 2;
      break;
    case common::Codec::kInt8:
      // n + 4·ceil(n / 1024) bytes.
      elements = bytes.size() * common::kInt8BlockElements /
                 (common::kInt8BlockElements + 4);
      while (elements > 0 && common::EncodedSize(codec, elements) > bytes.size()) {
        --elements;
      }
      break;
  }
  if (knobs & 0x80) elements += 1;
  if (!common::Validate(codec, bytes, elements).ok()) return;
  std::vector<float> out(elements), acc(elements, 1.0f);
  common::Decode(codec, bytes, absl::MakeSpan(out));
  for (float v : out) {
    if (!std::isfinite(v)) __builtin_trap();  // Validate let a non-finite by
  }
  common::AccumulateDecoded(codec, bytes, 0.5f, absl::MakeSpan(acc));
  // Re-encoding what was decoded must reproduce it (decode is a fixpoint).
  std::string again(common::EncodedSize(codec, elements), '\0');
  common::Encode(codec, out, absl::MakeSpan(again.data(), again.size()));
  std::vector<float> twice(elements);
  common::Decode(codec, again, absl::MakeSpan(twice));
  if (codec != common::Codec::kInt8 && twice != out) __builtin_trap();
}

}  // namespace
}  // namespace co2

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0] % co2::kModes;
  const uint8_t knobs = data[1];
  const std::string bytes(reinterpret_cast<const char*>(data + 2), size - 2);
  switch (mode) {
    case co2::kJoin:
      co2::FuzzJoin(bytes, knobs);
      break;
    case co2::kExchange:
      co2::FuzzExchange(bytes, knobs);
      break;
    case co2::kAnchorChunk:
      co2::FuzzAnchorChunk(bytes, knobs);
      break;
    case co2::kRecords:
      co2::FuzzRecords(data + 2, size - 2, knobs);
      break;
    default:
      co2::FuzzCodec(bytes, knobs);
  }
  return 0;
}
