// co2._core: the Python binding of the torch-free client (AnchorExchange over
// an AggregatorClient) and of the JobConfig rules. Torch stays on the Python
// side: parameters cross as the address and length of a contiguous float32
// CPU buffer that the calling Python object keeps alive, so the module works
// with whatever torch the interpreter has.
//
// Errors: absl::Status becomes co2.Error(code, message); a JobConfig the
// rules refuse becomes ValueError. Every blocking call releases the GIL;
// waits for an update poll for signals every 200 ms, so Ctrl-C ends them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/aggregator_client.h"
#include "client/algo.h"
#include "client/anchor_exchange.h"
#include "common/codec.h"
#include "common/grpc_status.h"
#include "common/host_tcp.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "common/malloc_settings.h"
#include "common/tls_config.h"
#include "google/protobuf/descriptor.h"

namespace py = pybind11;

namespace co2::python {
namespace {

// An algorithm that exchanges with the shards (not ddp); ValueError otherwise.
client::Algo ParseExchangeAlgo(const std::string& algo) {
  absl::StatusOr<client::Algo> parsed = client::ParseAlgo(algo);
  if (!parsed.ok() || *parsed == client::Algo::kDdp) {
    throw py::value_error(
        absl::StrCat("unknown algo '", algo,
                     "' (expected co2, localsgd, slowmo or diloco)"));
  }
  return *parsed;
}

// ValueError naming an unknown apply mode.
client::ApplyAt ParseApplyMode(const std::string& apply) {
  absl::StatusOr<client::ApplyAt> parsed = client::ParseApplyAt(apply);
  if (!parsed.ok()) {
    throw py::value_error(std::string(parsed.status().message()));
  }
  return *parsed;
}

using client::AggregatorClient;
using client::AnchorExchange;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;

// Raises co2.Error(code name, message) for a non-OK status.
[[noreturn]] void Raise(const absl::Status& status) {
  py::object error = py::module_::import("co2._errors").attr("Error");
  PyErr_SetObject(error.ptr(),
                  py::make_tuple(absl::StatusCodeToString(status.code()),
                                 std::string(status.message()))
                      .ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

// An enum value's Python name: MOMENTUM_HEAVY_BALL -> "heavy_ball". The
// prefix is the one of the enum's zero value (MOMENTUM_UNSPECIFIED), which
// every co2.v1 enum has, as proto3 style asks.
std::string EnumValueName(const FieldDescriptor* field, int number) {
  const EnumDescriptor* type = field->enum_type();
  const auto* value = type->FindValueByNumber(number);
  if (value == nullptr) return absl::StrCat(number);
  const auto* zero = type->FindValueByNumber(0);
  absl::string_view prefix;
  if (zero != nullptr) prefix = zero->name();
  if (!absl::ConsumeSuffix(&prefix, "UNSPECIFIED")) prefix = "";
  std::string name = value->name();
  if (absl::StartsWith(name, prefix)) name = name.substr(prefix.size());
  return absl::AsciiStrToLower(name);
}

int EnumValueNumber(const FieldDescriptor* field, const std::string& name) {
  const EnumDescriptor* type = field->enum_type();
  std::vector<std::string> known;
  for (int i = 0; i < type->value_count(); ++i) {
    const int number = type->value(i)->number();
    if (number == 0) continue;  // UNSPECIFIED
    const std::string candidate = EnumValueName(field, number);
    if (candidate == name) return number;
    known.push_back(candidate);
  }
  throw py::value_error(
      absl::StrCat("JobConfig.", field->name(), ": unknown value '", name,
                   "' (expected one of ", absl::StrJoin(known, ", "), ")"));
}

// JobConfig <-> dict of every field, enums by their lower-case names.
py::dict ToDict(const v1::JobConfig& config) {
  py::dict out;
  const auto* reflection = config.GetReflection();
  const auto* descriptor = config.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* f = descriptor->field(i);
    py::str key(f->name());
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT32:
        out[key] = reflection->GetUInt32(config, f);
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        out[key] = reflection->GetUInt64(config, f);
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        out[key] = reflection->GetFloat(config, f);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        out[key] = reflection->GetBool(config, f);
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        out[key] = EnumValueName(f, reflection->GetEnumValue(config, f));
        break;
      default:
        throw std::logic_error(
            absl::StrCat("JobConfig.", f->name(), " has an unbound type"));
    }
  }
  return out;
}

v1::JobConfig FromDict(const py::dict& values) {
  v1::JobConfig config;
  const auto* reflection = config.GetReflection();
  const auto* descriptor = config.GetDescriptor();
  for (const auto& [key, value] : values) {
    const std::string name = py::cast<std::string>(key);
    const FieldDescriptor* f = descriptor->FindFieldByName(name);
    if (f == nullptr) {
      throw py::value_error(
          absl::StrCat("JobConfig has no field '", name, "'"));
    }
    try {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_UINT32:
        case FieldDescriptor::CPPTYPE_UINT64: {
          const long long v = py::cast<long long>(value);
          const long long max = f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32
                                    ? 0xffffffffLL
                                    : LLONG_MAX;
          if (v < 0 || v > max) {
            throw py::value_error(absl::StrCat(
                "JobConfig.", name, " must be in [0, ", max, "], got ", v));
          }
          if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32) {
            reflection->SetUInt32(&config, f, static_cast<uint32_t>(v));
          } else {
            reflection->SetUInt64(&config, f, static_cast<uint64_t>(v));
          }
          break;
        }
        case FieldDescriptor::CPPTYPE_FLOAT:
          reflection->SetFloat(&config, f, py::cast<float>(value));
          break;
        case FieldDescriptor::CPPTYPE_BOOL:
          if (!py::isinstance<py::bool_>(value)) {
            throw py::value_error(
                absl::StrCat("JobConfig.", name, " must be True or False, got ",
                             py::str(value).cast<std::string>()));
          }
          reflection->SetBool(&config, f, value.cast<bool>());
          break;
        case FieldDescriptor::CPPTYPE_ENUM:
          reflection->SetEnumValue(
              &config, f, EnumValueNumber(f, py::cast<std::string>(value)));
          break;
        default:
          throw std::logic_error(
              absl::StrCat("JobConfig.", name, " has an unbound type"));
      }
    } catch (const py::cast_error&) {
      throw py::value_error(absl::StrCat(
          "JobConfig.", name, ": ",
          py::str(py::repr(value)).cast<std::string>(), " is not a ",
          f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM ? "str" : "number"));
    }
  }
  return config;
}

void Validate(const v1::JobConfig& config) {
  absl::Status status = common::ValidateJobConfig(config);
  if (!status.ok()) throw py::value_error(std::string(status.message()));
}

absl::Span<float> Buffer(uintptr_t address, size_t numel) {
  return absl::MakeSpan(reinterpret_cast<float*>(address), numel);
}

absl::Duration Seconds(double s) { return absl::Seconds(s); }

// Set by CheckSignals when it ends a wait of this thread for Ctrl-C; read
// and cleared by CheckInterruptible once the call returns.
thread_local bool interrupted = false;

// Polls for Ctrl-C from a thread that released the GIL.
absl::Status CheckSignals() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) {
    PyErr_Clear();  // raised again by the caller, with the GIL held
    interrupted = true;
    return absl::CancelledError("interrupted (KeyboardInterrupt)");
  }
  return absl::OkStatus();
}

// Raises KeyboardInterrupt for a wait that CheckSignals ended, else co2.Error.
void CheckInterruptible(const absl::Status& status) {
  const bool by_signal = std::exchange(interrupted, false);
  if (by_signal && status.code() == absl::StatusCode::kCancelled) {
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  }
  Check(status);
}

py::dict Times(const client::ExchangeTimes& t) {
  py::dict d;
  d["exposed_comm_s"] = absl::ToDoubleSeconds(t.exposed_comm);
  d["push_s"] = absl::ToDoubleSeconds(t.push);
  d["bytes_sent"] = t.bytes_sent;
  // The round a heal (or Rejoin) continued at, and why; None: no heal.
  d["healed_round"] = t.healed_round.has_value()
                          ? py::object(py::int_(*t.healed_round))
                          : py::object(py::none());
  d["heal_reason"] = t.heal_reason != nullptr
                         ? py::object(py::str(t.heal_reason))
                         : py::object(py::none());
  return d;
}

// The shards local rank `rank` of `local_ranks` owns (common::OwnedShards),
// as (begin, end); ValueError naming the values where it owns none.
std::pair<size_t, size_t> OwnedShardsOf(size_t num_shards, size_t local_ranks,
                                        size_t rank) {
  absl::StatusOr<common::Range> owned =
      common::OwnedShards(num_shards, local_ranks, rank);
  if (!owned.ok()) throw py::value_error(std::string(owned.status().message()));
  return {owned->begin, owned->end};
}

// The elements of the whole model that rank exchanges (common::RankRange).
std::pair<size_t, size_t> RankRangeOf(size_t num_parameters, size_t num_shards,
                                      size_t local_ranks, size_t rank) {
  absl::StatusOr<common::Range> range =
      common::RankRange(num_parameters, num_shards, local_ranks, rank);
  if (!range.ok()) throw py::value_error(std::string(range.status().message()));
  return {range->begin, range->end};
}

// One worker's connection to a job: AggregatorClient + AnchorExchange, over
// the whole model (the node's leader) or over the slice of one local rank.
class Exchange {
 public:
  // Joins the job; `x` (address, numel) holds this worker's initial
  // parameters and, on return, the anchor of start_round. With
  // `owned_shards` (shard indices [begin, end)) or local_ranks > 1 (then
  // local rank `local_rank` owns common::OwnedShards of them), the client
  // joins only those shards, `x` is their slice (slice()) and
  // num_parameters is the whole model's P. `heal`: a boundary the shards
  // cannot take back rejoins and fetches their anchor (times' healed_round),
  // and rejoin() is available.
  Exchange(std::vector<std::string> addresses, std::string job,
           std::string worker_id, const py::dict& config,
           const std::string& uplink_codec, uint64_t rounds,
           double samples_per_step, const std::string& ca_file,
           const std::string& cert_file, const std::string& key_file,
           const std::string& token_file, bool rejoin,
           std::optional<uint64_t> resume_round, double connect_timeout,
           double update_timeout, double eager_share, bool carry_progress,
           int apply_by_step, uintptr_t x, size_t numel,
           std::optional<std::pair<size_t, size_t>> owned_shards,
           size_t local_ranks, size_t local_rank, uint64_t num_parameters,
           bool heal) {
    client::ClientOptions co;
    if (local_ranks > 1 && !owned_shards.has_value()) {
      owned_shards = OwnedShardsOf(addresses.size(), local_ranks, local_rank);
    }
    if (owned_shards.has_value()) {
      const auto [begin, end] = *owned_shards;
      if (begin >= end || end > addresses.size()) {
        throw py::value_error(absl::StrCat(
            "owned_shards [", begin, ", ", end, ") is not a non-empty range of the ",
            addresses.size(), " shards"));
      }
      if (num_parameters == 0) {
        throw py::value_error(
            "owned_shards needs num_parameters, the whole model's P");
      }
      co.owned_shards = common::Range{begin, end};
    } else if (num_parameters != 0 && num_parameters != numel) {
      throw py::value_error(absl::StrCat("x has ", numel,
                                         " elements, num_parameters is ",
                                         num_parameters));
    }
    co.num_parameters = num_parameters;
    co.addresses = std::move(addresses);
    co.job = std::move(job);
    co.worker_id = std::move(worker_id);
    co.job_config = FromDict(config);
    Validate(co.job_config);
    absl::StatusOr<common::Codec> uplink = common::ParseCodec(uplink_codec);
    if (!uplink.ok())
      throw py::value_error(std::string(uplink.status().message()));
    co.uplink_codec = *uplink;
    co.rejoin = rejoin;
    co.resume_round = resume_round;
    co.tls.ca_file = ca_file;
    co.tls.cert_file = cert_file;
    co.tls.key_file = key_file;
    if (!token_file.empty()) {
      absl::StatusOr<std::string> token = common::ReadTokenFile(token_file);
      if (!token.ok())
        throw py::value_error(std::string(token.status().message()));
      co.token = *token;
    }
    co.connect_timeout = Seconds(connect_timeout);
    co.reconnect_timeout = Seconds(connect_timeout);
    co.rpc_timeout = std::min(co.connect_timeout, absl::Seconds(30));

    client::AnchorExchangeOptions eo;
    eo.rounds = rounds;
    eo.samples_per_step = samples_per_step;
    eo.update_timeout = Seconds(update_timeout);
    eo.push_timeout = Seconds(update_timeout);
    eo.uplink_codec = *uplink;
    eo.check_interrupt = CheckSignals;
    eo.eager_share = eager_share;
    eo.carry_progress = carry_progress;
    eo.apply_by_step = apply_by_step;
    // As co2-train --heal: connect again as a rejoining worker, which
    // fetches the shards' anchor (of this client's shards only).
    if (heal) eo.reconnect = client::RejoinWith(co);

    // Connect runs on its own thread with a copy of x, so that Ctrl-C can
    // leave it (the thread finishes on its own, within connect_timeout).
    auto initial = std::make_shared<std::vector<float>>(
        Buffer(x, numel).begin(), Buffer(x, numel).end());
    std::packaged_task<absl::StatusOr<std::unique_ptr<AnchorExchange>>()> task(
        [co = std::move(co), eo,
         initial]() mutable -> absl::StatusOr<std::unique_ptr<AnchorExchange>> {
          auto client = AggregatorClient::Connect(std::move(co),
                                                  absl::MakeSpan(*initial));
          if (!client.ok()) return client.status();
          // The anchor takes the copy over: no third copy of the slice.
          return AnchorExchange::Create(eo, std::move(*client),
                                        std::move(*initial));
        });
    auto result = task.get_future();
    std::thread(std::move(task)).detach();
    {
      py::gil_scoped_release release;
      while (result.wait_for(std::chrono::milliseconds(200)) !=
             std::future_status::ready) {
        if (!CheckSignals().ok()) {
          interrupted = false;
          py::gil_scoped_acquire gil;
          PyErr_SetNone(PyExc_KeyboardInterrupt);
          throw py::error_already_set();
        }
      }
    }
    absl::StatusOr<std::unique_ptr<AnchorExchange>> exchange = result.get();
    Check(exchange.status());
    exchange_ = std::move(*exchange);
    const std::vector<float>& anchor = exchange_->anchor();
    std::copy(anchor.begin(), anchor.end(), Buffer(x, numel).begin());
  }

  uint64_t start_round() const { return exchange_->start_round(); }
  std::pair<size_t, size_t> slice() const {
    const common::Range r = exchange_->client().slice();
    return {r.begin, r.end};
  }

  // Heals now (AnchorExchange::Rejoin): for a rank whose node-mate healed,
  // or which is behind them. x (the slice) ← the shards' anchor; the times
  // name the round it continues at. Needs heal=True.
  py::dict Rejoin(uintptr_t x, size_t numel) {
    return Timed([&](client::ExchangeTimes& times) {
      return exchange_->Rejoin("a rank of this node healed or is behind",
                               Buffer(x, numel), times);
    });
  }
  uint32_t staleness() const { return exchange_->staleness(); }
  py::dict job_config() const {
    return ToDict(exchange_->client().job_config());
  }

  py::dict Boundary(uint64_t round, int steps, uintptr_t x, size_t numel) {
    return Timed([&](client::ExchangeTimes& times) {
      return exchange_->Boundary(round, steps, Buffer(x, numel), times);
    });
  }

  py::dict Drain(uint64_t owed, uintptr_t x, size_t numel) {
    return Timed([&](client::ExchangeTimes& times) {
      return exchange_->Drain(owed, Buffer(x, numel), times);
    });
  }

  bool ApplyDue(uint64_t round, int steps) const {
    return exchange_->ApplyDue(round, steps);
  }

  py::dict ApplyOwed(uint64_t round, int steps, uintptr_t x, size_t numel) {
    return Timed([&](client::ExchangeTimes& times) {
      return exchange_->ApplyOwed(round, steps, Buffer(x, numel), times);
    });
  }

  py::dict AwaitUpdate(uint64_t round) {
    return Timed([&](client::ExchangeTimes& times) {
      return exchange_->AwaitUpdate(round, times);
    });
  }

  void VerifyAnchor(uint64_t anchor_round) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = exchange_->VerifyAnchor(anchor_round);
    }
    Check(status);
  }

  void Leave() {
    py::gil_scoped_release release;
    exchange_->Leave();
  }

  void CopyAnchor(uintptr_t out, size_t numel) const {
    const std::vector<float>& anchor = exchange_->anchor();
    if (numel != anchor.size()) {
      throw py::value_error(absl::StrCat("anchor has ", anchor.size(),
                                         " elements, the buffer ", numel));
    }
    std::copy(anchor.begin(), anchor.end(), Buffer(out, numel).begin());
  }

  // Copies the error-feedback residual into `out`; its length (0: fp32).
  size_t CopyResidual(uintptr_t out, size_t numel) const {
    const absl::Span<const float> residual = exchange_->residual();
    if (!residual.empty() && numel != residual.size()) {
      throw py::value_error(absl::StrCat("the residual has ", residual.size(),
                                         " elements, the buffer ", numel));
    }
    std::copy(residual.begin(), residual.end(), Buffer(out, numel).begin());
    return residual.size();
  }

  // Copies the start point's state (AnchorExchange::start_offset and
  // last_delta, numel each) and returns how many buffers it filled: 0 with
  // eager updates and carried progress off, 1 (e only) with carried
  // progress, 2 with eager updates. last_delta may be 0 (no buffer) with
  // carried progress.
  int CopyStartOffset(uintptr_t offset, uintptr_t last_delta,
                      size_t numel) const {
    const absl::Span<const float> e = exchange_->start_offset();
    if (e.empty()) return 0;
    if (numel != e.size()) {
      throw py::value_error(absl::StrCat("copy_start_offset: ", numel,
                                         " elements, the job has ", e.size()));
    }
    std::copy(e.begin(), e.end(), Buffer(offset, numel).begin());
    const absl::Span<const float> last = exchange_->last_delta();
    if (last.empty()) return 1;
    if (last_delta == 0) {
      throw py::value_error("copy_start_offset: eager updates keep a last delta, "
                            "and no buffer was given for it");
    }
    std::copy(last.begin(), last.end(), Buffer(last_delta, numel).begin());
    return 2;
  }

  // last_delta 0: none (carried progress keeps none).
  void RestoreStartOffset(uintptr_t offset, uintptr_t last_delta,
                          size_t numel) {
    absl::Status status = exchange_->RestoreStartOffset(
        Buffer(offset, numel),
        last_delta == 0 ? absl::Span<const float>()
                        : absl::Span<const float>(Buffer(last_delta, numel)));
    if (!status.ok()) throw py::value_error(std::string(status.message()));
  }

  void RestoreResidual(uintptr_t in, size_t numel) {
    absl::Status status = exchange_->RestoreResidual(
        absl::MakeConstSpan(reinterpret_cast<const float*>(in), numel));
    if (!status.ok()) throw py::value_error(std::string(status.message()));
  }

  // co2's state this rank holds (AnchorExchange::state_bytes).
  py::dict Memory() const {
    const client::AnchorExchange::StateBytes bytes = exchange_->state_bytes();
    py::dict d;
    d["anchor"] = bytes.anchor;
    d["client_buffers"] = bytes.client_buffers;
    return d;
  }

  py::dict Stats() const {
    const client::ClientStats s = exchange_->client().stats();
    py::dict d;
    d["rounds_pushed"] = s.rounds_pushed;
    d["updates_received"] = s.updates_received;
    d["bytes_sent"] = s.bytes_sent;
    d["bytes_received"] = s.bytes_received;
    d["broken_streams"] = s.broken_streams;
    d["reconnects"] = s.reconnects;
    d["update_wait_s"] = absl::ToDoubleSeconds(s.update_wait);
    return d;
  }

 private:
  // Runs one exchange call with the GIL released and returns its times; a
  // failure (Ctrl-C included) is raised.
  template <typename Call>
  py::dict Timed(Call call) {
    client::ExchangeTimes times;
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = call(times);
    }
    CheckInterruptible(status);
    return Times(times);
  }

  std::unique_ptr<AnchorExchange> exchange_;
};

}  // namespace
}  // namespace co2::python

PYBIND11_MODULE(_core, m) {
  using namespace co2;          // NOLINT: the module's one scope
  using namespace co2::python;  // NOLINT
  m.doc() = "co2's C++ client (internal; use the co2 package).";
  m.attr("__version__") = CO2_VERSION;
  m.def(
      "default_job_config",
      [] { return ToDict(common::DefaultJobConfig(0, 0)); },
      "The C++ defaults of every JobConfig field.");
  m.def(
      "job_config_round_trip",
      [](const py::dict& values) { return ToDict(FromDict(values)); },
      "dict -> JobConfig message -> dict (for tests).");
  m.def(
      "validate_job_config",
      [](const py::dict& values) { Validate(FromDict(values)); },
      "ValueError naming the first field out of range.");
  m.def(
      "apply_algo",
      [](const std::string& algo, const py::dict& values) {
        v1::JobConfig config = FromDict(values);
        client::ApplyAlgo(ParseExchangeAlgo(algo), config);
        return ToDict(config);
      },
      "The JobConfig dict with what the algorithm fixes applied.");
  m.def(
      "check_apply",
      [](const std::string& algo, const std::string& apply,
         bool deterministic) {
        const absl::Status s = client::CheckApplyAt(
            ParseExchangeAlgo(algo), ParseApplyMode(apply), deterministic);
        if (!s.ok()) throw py::value_error(absl::StrCat("apply=", s.message()));
      },
      "ValueError unless `apply` is a mode `algo` can run, in a deterministic "
      "job or not (client/algo.h).");
  m.def(
      "check_apply_by",
      [](const std::string& apply, int apply_by_step, int tau) {
        const absl::Status s =
            client::CheckApplyBy(ParseApplyMode(apply), apply_by_step, tau);
        if (!s.ok()) {
          throw py::value_error(absl::StrCat("apply_by_step ", s.message()));
        }
      },
      "ValueError unless `apply_by_step` is 0 or a step of a round of `tau` "
      "that `apply` can bound (client/algo.h).");
  m.def(
      "default_apply",
      [](const std::string& algo, bool deterministic) {
        return std::string(client::ApplyAtName(
            client::DefaultApplyAt(ParseExchangeAlgo(algo), deterministic)));
      },
      "The apply mode where the user picks none (client/algo.h).");
  m.def(
      "default_carry_progress",
      [](const std::string& algo, bool eager) {
        return client::DefaultCarryProgress(ParseExchangeAlgo(algo), eager);
      },
      "Whether a worker carries its progress where the user does not say "
      "(client/algo.h).");
  m.def(
      "outer_defaults",
      [](const std::string& algo) {
        const client::OuterDefaults outer =
            client::OuterDefaultsOf(ParseExchangeAlgo(algo));
        return py::make_tuple(outer.alpha, outer.beta);
      },
      "(alpha, beta) the algorithm runs with where the user sets neither.");
  m.def("owned_shards", &OwnedShardsOf, py::arg("num_shards"),
        py::arg("local_ranks"), py::arg("rank"),
        "(begin, end): the shard indices local rank `rank` of `local_ranks` "
        "owns (common/layout.h); ValueError where it owns none.");
  m.def("rank_range", &RankRangeOf, py::arg("num_parameters"),
        py::arg("num_shards"), py::arg("local_ranks"), py::arg("rank"),
        "(begin, end): the elements of the model that rank exchanges "
        "(common/layout.h).");
  m.def("owed_update", [](uint32_t staleness, uint64_t rounds, uint64_t round) {
    return client::OwedUpdate(staleness, rounds, round);
  });
  m.def("keep_large_buffers_in_heap", &common::KeepLargeBuffersInHeap,
        "glibc malloc settings for a training process (common/malloc_settings.h).");
  m.def("protocol_version", [] { return common::kProtocolVersion; });
  m.def(
      "describe_host_tcp",
      [](double link_mbit, double link_rtt) {
        if (!(link_mbit >= 0) || std::isinf(link_mbit)) {
          throw py::value_error(
              absl::StrCat("link_mbit must be >= 0 (Mbit/s), got ", link_mbit));
        }
        if (!(link_rtt >= 0) || std::isinf(link_rtt)) {
          throw py::value_error(
              absl::StrCat("link_rtt must be >= 0 (seconds), got ", link_rtt));
        }
        const common::HostTcpCheck check = common::CheckHostTcp(
            {link_mbit * 1e6, absl::Seconds(link_rtt)});
        return py::make_tuple(check.limits, check.line);
      },
      "(limits, line): whether this host's TCP settings cap one stream below "
      "the path (link_mbit Mbit/s, link_rtt seconds), and the line that says "
      "so (common/host_tcp.h).");
  py::class_<Exchange>(m, "Exchange")
      .def(py::init<std::vector<std::string>, std::string, std::string,
                    const py::dict&, const std::string&, uint64_t, double,
                    const std::string&, const std::string&, const std::string&,
                    const std::string&, bool, std::optional<uint64_t>, double,
                    double, double, bool, int, uintptr_t, size_t,
                    std::optional<std::pair<size_t, size_t>>, size_t, size_t,
                    uint64_t, bool>(),
           py::arg("addresses"), py::arg("job"), py::arg("worker_id"),
           py::arg("config"), py::arg("uplink_codec"), py::arg("rounds"),
           py::arg("samples_per_step"), py::arg("ca_file"),
           py::arg("cert_file"), py::arg("key_file"), py::arg("token_file"),
           py::arg("rejoin"), py::arg("resume_round"),
           py::arg("connect_timeout"), py::arg("update_timeout"),
           py::arg("eager_share"), py::arg("carry_progress"),
           py::arg("apply_by_step"), py::arg("x"), py::arg("numel"),
           py::arg("owned_shards") = py::none(), py::arg("local_ranks") = 1,
           py::arg("local_rank") = 0, py::arg("num_parameters") = 0,
           py::arg("heal") = false)
      .def_property_readonly("start_round", &Exchange::start_round)
      .def_property_readonly("staleness", &Exchange::staleness)
      .def_property_readonly("slice", &Exchange::slice,
                             "(begin, end): the elements of the whole model "
                             "this exchange serves.")
      .def("rejoin", &Exchange::Rejoin, py::arg("x"), py::arg("numel"))
      .def_property_readonly("job_config", &Exchange::job_config)
      .def("boundary", &Exchange::Boundary, py::arg("round"), py::arg("steps"),
           py::arg("x"), py::arg("numel"))
      .def("drain", &Exchange::Drain, py::arg("owed"), py::arg("x"),
           py::arg("numel"))
      .def("apply_due", &Exchange::ApplyDue, py::arg("round"),
           py::arg("steps"))
      .def("apply_owed", &Exchange::ApplyOwed, py::arg("round"),
           py::arg("steps"), py::arg("x"), py::arg("numel"))
      .def("await_update", &Exchange::AwaitUpdate, py::arg("round"))
      .def("verify_anchor", &Exchange::VerifyAnchor, py::arg("anchor_round"))
      .def("leave", &Exchange::Leave)
      .def("copy_anchor", &Exchange::CopyAnchor, py::arg("out"),
           py::arg("numel"))
      .def("copy_residual", &Exchange::CopyResidual, py::arg("out"),
           py::arg("numel"))
      .def("copy_start_offset", &Exchange::CopyStartOffset, py::arg("offset"),
           py::arg("last_delta"), py::arg("numel"))
      .def("restore_start_offset", &Exchange::RestoreStartOffset,
           py::arg("offset"), py::arg("last_delta"), py::arg("numel"))
      .def("restore_residual", &Exchange::RestoreResidual, py::arg("data"),
           py::arg("numel"))
      .def("memory", &Exchange::Memory)
      .def("stats", &Exchange::Stats);
}
