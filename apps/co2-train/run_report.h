// The reports of a co2-train run: what each rank writes when it finishes
// (RankReport), and the merged JSON report the launcher writes for the user
// (final metrics, per-round curve, wall time, exposed communication, bytes
// sent, parameter consistency). JSON goes through protobuf's Struct, so both
// directions use a real parser and writer. Pure functions; any thread.
#ifndef CO2_APPS_CO2_TRAIN_RUN_REPORT_H_
#define CO2_APPS_CO2_TRAIN_RUN_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/layout.h"

namespace co2::client {

struct RankRound {
  uint64_t round = 0;
  int steps = 0;
  double loss = 0;            // mean training loss of the round's steps
  double metric = -1;         // periodic evaluation, -1 when none this round
  double eval_loss = -1;      // loss of that evaluation, -1 when none
  double compute_s = 0;       // step(): collectives + inner steps
  double exposed_comm_s = 0;  // waiting for the outer update (ddp: all-reduce)
  double boundary_s = 0;
  uint64_t bytes_sent = 0;
  std::string params_hash;  // hex, after the boundary
  // --apply=arrival: the inner steps done when the round's owed update was
  // applied; 0 when at the boundary (RoundStats::applied_after_steps).
  int applied_after_steps = 0;
  // The worker healed at this boundary (co2-train --heal): the round it
  // continued at, and why.
  std::optional<uint64_t> healed_to;
  std::string heal_reason;
};

struct RankReport {
  int worker = 0;
  int local_rank = 0;
  bool leader = false;
  int64_t steps = 0;
  double wall_s = 0;   // whole process life in RunWorker
  double train_s = 0;  // first step to Finish
  double exposed_comm_s = 0;
  uint64_t bytes_sent = 0;
  std::string final_hash;
  std::string metric_name;  // "test_accuracy" | "val_perplexity"
  std::map<std::string, double> final_metrics;  // leader of worker 0 only
  std::map<std::string, double> memory_bytes;
  // With rank slices, the part of the model this rank exchanged.
  std::optional<common::Range> slice;
  std::vector<RankRound> rounds;
  // The worker left the job (a job that shrank) before computing this
  // round; its last report round is the one before.
  std::optional<uint64_t> left_at;
};

absl::Status WriteRankReport(const std::string& path, const RankReport& report);
absl::StatusOr<RankReport> ReadRankReport(const std::string& path);

// Run-level facts the launcher adds around the rank reports.
struct RunInfo {
  std::map<std::string, std::string> settings;  // flag name -> value
  double wall_s = 0;
  std::vector<std::string> aggregators;
};

struct MergedSummary {
  int rounds = 0;         // rounds some rank ran (the curve's length)
  double final_loss = 0;  // mean over ranks of the last round's loss
  std::map<std::string, double> final_metrics;
  double exposed_comm_s = 0;      // mean over workers (leaders)
  double exposed_comm_fraction = 0;
  uint64_t bytes_sent = 0;        // sum over the ranks that send
  bool params_identical = false;  // every rank, every boundary
  std::string first_difference;   // when not identical
};

// Merges the rank reports (all W × L of them). A rank may start at a later
// round (a worker restarted into the job, or one that joined it), skip
// rounds (one that healed) and end earlier (one that left it): the summary
// counts every round that some rank ran, and the parameters after each
// boundary are compared among all the ranks that hold them (an entry that
// healed holds those of the boundary before the round it continued at);
// final models among the ranks that did not leave. INVALID_ARGUMENT when a
// rank's rounds are not contiguous up to the last round of the longest (of
// a leaver: up to the round before its left_at).
absl::StatusOr<MergedSummary> Summarize(const std::vector<RankReport>& ranks);

// The user-facing JSON document.
std::string MergedReportJson(const RunInfo& info,
                             const std::vector<RankReport>& ranks,
                             const MergedSummary& summary);

// Writes `contents` to `path` atomically (temporary file + rename).
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents);

}  // namespace co2::client

#endif  // CO2_APPS_CO2_TRAIN_RUN_REPORT_H_
