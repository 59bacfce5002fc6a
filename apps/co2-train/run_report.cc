#include "apps/co2-train/run_report.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace co2::client {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

Value Num(double v) {
  Value out;
  out.set_number_value(v);
  return out;
}
Value Str(const std::string& v) {
  Value out;
  out.set_string_value(v);
  return out;
}
Value Bool(bool v) {
  Value out;
  out.set_bool_value(v);
  return out;
}
Value Obj(Struct s) {
  Value out;
  *out.mutable_struct_value() = std::move(s);
  return out;
}
// [begin, end]
Value SliceValue(const common::Range& slice) {
  ListValue ends;
  *ends.add_values() = Num(static_cast<double>(slice.begin));
  *ends.add_values() = Num(static_cast<double>(slice.end));
  Value v;
  *v.mutable_list_value() = std::move(ends);
  return v;
}

Value List(ListValue l) {
  Value out;
  *out.mutable_list_value() = std::move(l);
  return out;
}
void Put(Struct& s, const std::string& key, Value v) {
  (*s.mutable_fields())[key] = std::move(v);
}
Struct FromMap(const std::map<std::string, double>& m) {
  Struct s;
  for (const auto& [k, v] : m) Put(s, k, Num(v));
  return s;
}

// Field accessors that tolerate absence (a field missing reads as default).
double GetNum(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? 0 : it->second.number_value();
}
std::string GetStr(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? "" : it->second.string_value();
}
const Struct* GetObj(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  if (it == s.fields().end() || !it->second.has_struct_value()) return nullptr;
  return &it->second.struct_value();
}
std::map<std::string, double> ToMap(const Struct* s) {
  std::map<std::string, double> out;
  if (s == nullptr) return out;
  for (const auto& [k, v] : s->fields()) out[k] = v.number_value();
  return out;
}

std::string ToJson(const Struct& s) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  std::string out;
  // A Struct holds only JSON-representable values: printing cannot fail.
  (void)google::protobuf::util::MessageToJsonString(s, &out, options);
  return out;
}

Struct RoundToStruct(const RankRound& r) {
  Struct s;
  Put(s, "round", Num(r.round));
  Put(s, "steps", Num(r.steps));
  Put(s, "loss", Num(r.loss));
  if (r.metric >= 0) Put(s, "metric", Num(r.metric));
  if (r.eval_loss >= 0) Put(s, "eval_loss", Num(r.eval_loss));
  Put(s, "compute_s", Num(r.compute_s));
  Put(s, "exposed_comm_s", Num(r.exposed_comm_s));
  Put(s, "boundary_s", Num(r.boundary_s));
  Put(s, "bytes_sent", Num(static_cast<double>(r.bytes_sent)));
  Put(s, "params_hash", Str(r.params_hash));
  if (r.applied_after_steps > 0) {
    Put(s, "applied_after_steps", Num(r.applied_after_steps));
  }
  if (r.healed_to) {
    Put(s, "healed_to", Num(static_cast<double>(*r.healed_to)));
    Put(s, "heal_reason", Str(r.heal_reason));
  }
  return s;
}

RankRound RoundFromStruct(const Struct& s) {
  RankRound r;
  r.round = static_cast<uint64_t>(GetNum(s, "round"));
  r.steps = static_cast<int>(GetNum(s, "steps"));
  r.loss = GetNum(s, "loss");
  r.metric = s.fields().count("metric") ? GetNum(s, "metric") : -1;
  r.eval_loss = s.fields().count("eval_loss") ? GetNum(s, "eval_loss") : -1;
  r.compute_s = GetNum(s, "compute_s");
  r.exposed_comm_s = GetNum(s, "exposed_comm_s");
  r.boundary_s = GetNum(s, "boundary_s");
  r.bytes_sent = static_cast<uint64_t>(GetNum(s, "bytes_sent"));
  r.params_hash = GetStr(s, "params_hash");
  r.applied_after_steps = static_cast<int>(GetNum(s, "applied_after_steps"));
  if (s.fields().count("healed_to")) {
    r.healed_to = static_cast<uint64_t>(GetNum(s, "healed_to"));
    r.heal_reason = GetStr(s, "heal_reason");
  }
  return r;
}

// Rank r's entry for round n; null if r has none (it rejoined later, or
// healed past it). A rank's rounds rise (Summarize checks).
const RankRound* RoundOf(const RankReport& r, uint64_t n) {
  auto it = std::lower_bound(
      r.rounds.begin(), r.rounds.end(), n,
      [](const RankRound& round, uint64_t x) { return round.round < x; });
  return it != r.rounds.end() && it->round == n ? &*it : nullptr;
}

// The rank that reached the last round, with the most rounds among those
// (named when a rank's rounds do not reach that round).
const RankReport& Longest(const std::vector<RankReport>& ranks) {
  auto key = [](const RankReport& r) {
    return std::make_pair(r.rounds.empty() ? 0 : r.rounds.back().round + 1,
                          r.rounds.size());
  };
  const RankReport* longest = &ranks[0];
  for (const RankReport& r : ranks) {
    if (key(r) > key(*longest)) longest = &r;
  }
  return *longest;
}

// Every round that some rank ran, ascending. No one rank need hold them
// all: one that healed skips rounds the others ran, one restarted into the
// job starts at a later round.
std::vector<uint64_t> JobRounds(const std::vector<RankReport>& ranks) {
  std::set<uint64_t> rounds;
  for (const RankReport& r : ranks) {
    for (const RankRound& round : r.rounds) rounds.insert(round.round);
  }
  return std::vector<uint64_t>(rounds.begin(), rounds.end());
}

// The boundary whose parameters an entry holds: its own round's, or, where
// the rank healed, those every rank had after the boundary of the round
// before the one it continued at. None for a heal to round 0 (A_0).
std::optional<uint64_t> BoundaryOf(const RankRound& round) {
  if (!round.healed_to) return round.round;
  if (*round.healed_to == 0) return std::nullopt;
  return *round.healed_to - 1;
}

// "worker W rank L (hash)", with the heal where the entry is one.
std::string Holder(const RankReport& r, const RankRound& round) {
  std::string out = absl::StrCat("worker ", r.worker, " rank ", r.local_rank,
                                 " (", round.params_hash);
  if (round.healed_to) {
    absl::StrAppend(&out, ", healed at round ", round.round, " to ",
                    *round.healed_to);
  }
  return out + ")";
}

// The first boundary (in round order) where two ranks hold different
// parameters, described; empty if every boundary held by two ranks or more
// agrees.
std::string FirstDifference(const std::vector<RankReport>& ranks) {
  std::map<uint64_t, std::vector<std::pair<const RankReport*, const RankRound*>>>
      holders;
  for (const RankReport& r : ranks) {
    for (const RankRound& round : r.rounds) {
      if (const std::optional<uint64_t> b = BoundaryOf(round)) {
        holders[*b].emplace_back(&r, &round);
      }
    }
  }
  for (const auto& [boundary, held] : holders) {
    const auto& [first_rank, first_round] = held.front();
    for (const auto& [rank, round] : held) {
      if (round->params_hash != first_round->params_hash) {
        return absl::StrCat("round ", boundary, ": ", Holder(*rank, *round),
                            " differs from ", Holder(*first_rank, *first_round));
      }
    }
  }
  return "";
}

// The entry of round n the curve shows: the lead's, else that of the first
// rank that ran it without healing at its boundary, else the first.
const RankRound& CurveEntry(const std::vector<RankReport>& ranks,
                            const RankReport& lead, uint64_t n) {
  if (const RankRound* from_lead = RoundOf(lead, n)) return *from_lead;
  const RankRound* any = nullptr;
  for (const RankReport& r : ranks) {
    const RankRound* round = RoundOf(r, n);
    if (round == nullptr) continue;
    if (!round->healed_to) return *round;
    if (any == nullptr) any = round;
  }
  return *any;  // n is one of JobRounds: some rank ran it
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write ", tmp));
    }
    out << contents;
    out.flush();
    if (!out) return absl::DataLossError(absl::StrCat("short write to ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::Status WriteRankReport(const std::string& path, const RankReport& r) {
  Struct s;
  Put(s, "worker", Num(r.worker));
  Put(s, "local_rank", Num(r.local_rank));
  Put(s, "leader", Bool(r.leader));
  Put(s, "steps", Num(static_cast<double>(r.steps)));
  Put(s, "wall_s", Num(r.wall_s));
  Put(s, "train_s", Num(r.train_s));
  Put(s, "exposed_comm_s", Num(r.exposed_comm_s));
  Put(s, "bytes_sent", Num(static_cast<double>(r.bytes_sent)));
  Put(s, "final_hash", Str(r.final_hash));
  Put(s, "metric_name", Str(r.metric_name));
  Put(s, "final_metrics", Obj(FromMap(r.final_metrics)));
  Put(s, "memory_bytes", Obj(FromMap(r.memory_bytes)));
  if (r.slice) Put(s, "slice", SliceValue(*r.slice));
  ListValue rounds;
  for (const RankRound& round : r.rounds) {
    *rounds.add_values() = Obj(RoundToStruct(round));
  }
  Put(s, "rounds", List(std::move(rounds)));
  if (r.left_at) Put(s, "left_at", Num(static_cast<double>(*r.left_at)));
  return WriteFileAtomically(path, ToJson(s));
}

absl::StatusOr<RankReport> ReadRankReport(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  Struct s;
  auto parsed = google::protobuf::util::JsonStringToMessage(buffer.str(), &s);
  if (!parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a rank report: ", parsed.ToString()));
  }
  RankReport r;
  r.worker = static_cast<int>(GetNum(s, "worker"));
  r.local_rank = static_cast<int>(GetNum(s, "local_rank"));
  auto leader = s.fields().find("leader");
  r.leader = leader != s.fields().end() && leader->second.bool_value();
  r.steps = static_cast<int64_t>(GetNum(s, "steps"));
  r.wall_s = GetNum(s, "wall_s");
  r.train_s = GetNum(s, "train_s");
  r.exposed_comm_s = GetNum(s, "exposed_comm_s");
  r.bytes_sent = static_cast<uint64_t>(GetNum(s, "bytes_sent"));
  r.final_hash = GetStr(s, "final_hash");
  r.metric_name = GetStr(s, "metric_name");
  r.final_metrics = ToMap(GetObj(s, "final_metrics"));
  r.memory_bytes = ToMap(GetObj(s, "memory_bytes"));
  auto slice = s.fields().find("slice");
  if (slice != s.fields().end()) {
    const ListValue& ends = slice->second.list_value();
    if (ends.values_size() != 2) {
      return absl::DataLossError(
          absl::StrCat(path, ": slice is not [begin, end]"));
    }
    r.slice = common::Range{static_cast<uint64_t>(ends.values(0).number_value()),
                            static_cast<uint64_t>(ends.values(1).number_value())};
  }
  auto rounds = s.fields().find("rounds");
  if (rounds != s.fields().end()) {
    for (const Value& v : rounds->second.list_value().values()) {
      r.rounds.push_back(RoundFromStruct(v.struct_value()));
    }
  }
  if (s.fields().count("left_at")) {
    r.left_at = static_cast<uint64_t>(GetNum(s, "left_at"));
  }
  return r;
}

absl::StatusOr<MergedSummary> Summarize(const std::vector<RankReport>& ranks) {
  MergedSummary out;
  if (ranks.empty()) return absl::InvalidArgumentError("no rank reports");
  // A restarted worker reports the rounds from the one it rejoined at, and
  // one that healed skips from the round it healed at to the one it
  // continued at, so rounds are matched by number; every rank must end at
  // the same round. A worker restarted after the job's last round reports
  // none (its final model, the anchor it fetched, is still compared).
  const RankReport* longest = &Longest(ranks);
  const size_t rounds = longest->rounds.size();
  out.rounds = static_cast<int>(JobRounds(ranks).size());
  out.first_difference = FirstDifference(ranks);
  out.params_identical = out.first_difference.empty();
  int leaders = 0;
  int ranks_with_rounds = 0;
  double train_s = 0;
  for (const RankReport& r : ranks) {
    const uint64_t last = rounds > 0 ? longest->rounds.back().round : 0;
    // A rank that healed past the last round (in Finish) ends with the
    // final anchor all the same.
    const RankRound* end = r.rounds.empty() ? nullptr : &r.rounds.back();
    bool contiguous =
        end == nullptr ||
        (r.left_at ? end->round + 1 == *r.left_at
                   : end->round == last ||
                         (end->healed_to && *end->healed_to > last));
    for (size_t i = 1; i < r.rounds.size() && contiguous; ++i) {
      const RankRound& before = r.rounds[i - 1];
      contiguous =
          r.rounds[i].round == before.healed_to.value_or(before.round + 1);
    }
    if (!contiguous) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", r.worker, " rank ", r.local_rank, " reports ",
          r.rounds.size(), " rounds that are not contiguous up to round ",
          last, " (worker ", longest->worker, " rank ", longest->local_rank,
          " reports ", rounds, ")"));
    }
    if (!r.final_metrics.empty()) out.final_metrics = r.final_metrics;
    out.bytes_sent += r.bytes_sent;
    if (r.leader) {
      ++leaders;
      out.exposed_comm_s += r.exposed_comm_s;
      train_s += r.train_s;
    }
    if (!r.rounds.empty()) {
      out.final_loss += r.rounds.back().loss;
      ++ranks_with_rounds;
    }
  }
  // A worker that left holds the anchor of its last round, not the final.
  std::vector<const RankReport*> stayed;
  for (const RankReport& r : ranks) {
    if (!r.left_at) stayed.push_back(&r);
  }
  const bool finals_differ =
      std::any_of(stayed.begin(), stayed.end(), [&](const RankReport* r) {
        return r->final_hash != stayed[0]->final_hash;
      });
  if (out.params_identical && finals_differ) {
    out.params_identical = false;
    std::vector<std::string> hashes;
    for (const RankReport* r : stayed) {
      hashes.push_back(absl::StrCat("worker ", r->worker, " rank ",
                                    r->local_rank, " ", r->final_hash));
    }
    out.first_difference =
        absl::StrCat("final models differ: ", absl::StrJoin(hashes, ", "));
  }
  if (ranks_with_rounds > 0) out.final_loss /= ranks_with_rounds;
  if (leaders > 0) {
    out.exposed_comm_s /= leaders;
    train_s /= leaders;
    out.exposed_comm_fraction = train_s > 0 ? out.exposed_comm_s / train_s : 0;
  }
  return out;
}

std::string MergedReportJson(const RunInfo& info,
                             const std::vector<RankReport>& ranks,
                             const MergedSummary& summary) {
  Struct s;
  Struct settings;
  for (const auto& [k, v] : info.settings) Put(settings, k, Str(v));
  Put(s, "settings", Obj(std::move(settings)));
  ListValue aggregators;
  for (const std::string& a : info.aggregators) *aggregators.add_values() = Str(a);
  Put(s, "aggregators", List(std::move(aggregators)));
  Put(s, "wall_time_s", Num(info.wall_s));
  Put(s, "rounds", Num(summary.rounds));
  Put(s, "final_train_loss", Num(summary.final_loss));
  Put(s, "final_metrics", Obj(FromMap(summary.final_metrics)));
  Put(s, "exposed_comm_s", Num(summary.exposed_comm_s));
  Put(s, "exposed_comm_fraction", Num(summary.exposed_comm_fraction));
  Put(s, "bytes_sent", Num(static_cast<double>(summary.bytes_sent)));
  Put(s, "params_identical", Bool(summary.params_identical));
  if (!summary.first_difference.empty()) {
    Put(s, "first_difference", Str(summary.first_difference));
  }
  // The curve: every round some rank ran, with the loss averaged over the
  // ranks that ran it; timings and metric from the leader of worker 0 (where
  // it did not run the round, from the first rank that did); bytes summed
  // over ranks.
  const RankReport* lead = &ranks[0];
  for (const RankReport& r : ranks) {
    if (r.worker == 0 && r.local_rank == 0) lead = &r;
  }
  ListValue curve;
  for (const uint64_t n : JobRounds(ranks)) {
    RankRound merged = CurveEntry(ranks, *lead, n);
    merged.loss = 0;
    merged.bytes_sent = 0;
    int ran = 0;
    for (const RankReport& r : ranks) {
      if (const RankRound* round = RoundOf(r, n)) {
        merged.loss += round->loss;
        merged.bytes_sent += round->bytes_sent;
        ++ran;
      }
    }
    merged.loss /= ran;
    *curve.add_values() = Obj(RoundToStruct(merged));
  }
  Put(s, "curve", List(std::move(curve)));
  Put(s, "memory_bytes", Obj(FromMap(lead->memory_bytes)));
  ListValue rank_list;
  for (const RankReport& r : ranks) {
    Struct rs;
    Put(rs, "worker", Num(r.worker));
    Put(rs, "local_rank", Num(r.local_rank));
    Put(rs, "leader", Bool(r.leader));
    Put(rs, "steps", Num(static_cast<double>(r.steps)));
    Put(rs, "wall_s", Num(r.wall_s));
    Put(rs, "train_s", Num(r.train_s));
    Put(rs, "exposed_comm_s", Num(r.exposed_comm_s));
    Put(rs, "bytes_sent", Num(static_cast<double>(r.bytes_sent)));
    Put(rs, "final_hash", Str(r.final_hash));
    Put(rs, "memory_bytes", Obj(FromMap(r.memory_bytes)));
    if (r.slice) Put(rs, "slice", SliceValue(*r.slice));
    if (r.left_at) Put(rs, "left_at", Num(static_cast<double>(*r.left_at)));
    ListValue hashes;
    for (const RankRound& round : r.rounds) {
      *hashes.add_values() = Str(round.params_hash);
    }
    Put(rs, "params_hashes", List(std::move(hashes)));
    *rank_list.add_values() = Obj(std::move(rs));
  }
  Put(s, "ranks", List(std::move(rank_list)));
  return ToJson(s);
}

}  // namespace co2::client
