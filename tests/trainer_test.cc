// co2-train end to end: the real binary, its child processes and its
// embedded aggregator, on the real Fashion-MNIST files. Each run is bounded
// by timeout(1), so a hang fails the test instead of stalling it.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace {

using ::co2::testing::TempDir;

using google::protobuf::Struct;
using google::protobuf::Value;
using ::testing::HasSubstr;
using ::testing::Not;

const char kMnist[] = "/usr/share/datasets/fashion-mnist";

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
  absl::Duration took;
};

RunResult RunCo2Train(const std::vector<std::string>& args, int timeout_s) {
  const std::string command =
      absl::StrCat("timeout -k 5 ", timeout_s, " ", CO2_TRAIN_BINARY, " ",
                   absl::StrJoin(args, " "), " 2>&1");
  RunResult result;
  const absl::Time start = absl::Now();
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    result.output.append(buffer, n);
  }
  const int status = pclose(pipe);
  result.took = absl::Now() - start;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1000;
  return result;
}

const Value& Field(const Struct& s, const std::string& key) {
  static const Value kNull;
  auto it = s.fields().find(key);
  return it == s.fields().end() ? kNull : it->second;
}

TEST(TrainerTest, TwoWorkersTwoLocalRanksThirtyRounds) {
  TempDir dir;
  const std::string report = dir.path() + "/report.json";
  const RunResult run = RunCo2Train(
      {"--task=fashion-mnist", "--algo=co2", "--workers=2", "--local_ranks=2",
       "--tau=2", "--steps=60", "--batch_size=32", "--lr=2e-3", "--seed=3",
       "--eval_every=10", "--eval_examples=500", "--final_eval_examples=2000",
       "--progress=false", absl::StrCat("--report=", report)},
      /*timeout_s=*/400);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("30 rounds"));
  EXPECT_THAT(run.output,
              HasSubstr("identical on every rank after every boundary: yes"));

  std::ifstream in(report);
  ASSERT_TRUE(in.good()) << "no report at " << report;
  std::stringstream text;
  text << in.rdbuf();
  Struct doc;
  CO2_ASSERT_OK(google::protobuf::util::JsonStringToMessage(text.str(), &doc))
      << "report is not JSON:\n"
      << text.str();

  EXPECT_EQ(Field(doc, "rounds").number_value(), 30);
  EXPECT_TRUE(Field(doc, "params_identical").bool_value());
  EXPECT_GT(Field(doc, "wall_time_s").number_value(), 0);
  EXPECT_GT(Field(doc, "bytes_sent").number_value(), 0);
  EXPECT_GE(Field(doc, "exposed_comm_s").number_value(), 0);
  const Struct& final_metrics = Field(doc, "final_metrics").struct_value();
  EXPECT_GT(Field(final_metrics, "test_accuracy").number_value(), 0.5);

  // The loss falls: the last five rounds against the first five.
  const auto& curve = Field(doc, "curve").list_value().values();
  ASSERT_EQ(curve.size(), 30);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += Field(curve[i].struct_value(), "loss").number_value();
    last += Field(curve[25 + i].struct_value(), "loss").number_value();
  }
  EXPECT_LT(last, 0.8 * first) << "first five " << first / 5 << ", last five "
                               << last / 5;
  EXPECT_TRUE(Field(curve[9].struct_value(), "metric").has_number_value());

  // Every rank holds identical parameters after each boundary.
  const auto& ranks = Field(doc, "ranks").list_value().values();
  ASSERT_EQ(ranks.size(), 4);
  const auto& hashes0 = Field(ranks[0].struct_value(), "params_hashes").list_value();
  ASSERT_EQ(hashes0.values_size(), 30);
  std::set<std::string> distinct;
  for (const Value& rank : ranks) {
    const auto& hashes = Field(rank.struct_value(), "params_hashes").list_value();
    ASSERT_EQ(hashes.values_size(), 30);
    for (int i = 0; i < 30; ++i) {
      EXPECT_EQ(hashes.values(i).string_value(), hashes0.values(i).string_value())
          << "round " << i;
    }
    distinct.insert(Field(rank.struct_value(), "final_hash").string_value());
  }
  EXPECT_EQ(distinct.size(), 1u);
  // The parameters move from round to round.
  EXPECT_NE(hashes0.values(0).string_value(), hashes0.values(29).string_value());
}

TEST(TrainerTest, DdpBaselineRuns) {
  TempDir dir;
  const std::string report = dir.path() + "/ddp.json";
  const RunResult run = RunCo2Train(
      {"--algo=ddp", "--workers=2", "--local_ranks=1", "--tau=4", "--steps=16",
       "--eval_every=0", "--final_eval_examples=500", "--progress=false",
       absl::StrCat("--report=", report)},
      /*timeout_s=*/300);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("4 rounds"));
  EXPECT_THAT(run.output,
              HasSubstr("identical on every rank after every boundary: yes"));
  EXPECT_TRUE(std::filesystem::exists(report));
}

// ---------------------------------------------------------------------------
// Bad input: a clear message, a non-zero exit, and no hang.

TEST(TrainerTest, MissingDatasetFailsClearly) {
  const RunResult run = RunCo2Train(
      {"--data_dir=/nonexistent/fashion-mnist", "--workers=1", "--steps=2"},
      /*timeout_s=*/60);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.exit_code, 124) << "timed out";
  EXPECT_THAT(run.output, HasSubstr("co2-train: error"));
  EXPECT_THAT(run.output, HasSubstr("/nonexistent/fashion-mnist"));
  EXPECT_LT(run.took, absl::Seconds(30));
}

// Writes `bytes` gzip-compressed to `path`.
void WriteGz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()), static_cast<int>(bytes.size()));
  gzclose(f);
}

TEST(TrainerTest, CorruptedIdxHeaderFailsClearly) {
  TempDir dir;
  for (const char* name :
       {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz"}) {
    std::filesystem::create_symlink(absl::StrCat(kMnist, "/", name),
                                    absl::StrCat(dir.path(), "/", name));
  }
  // Magic 0x00000804 (a 4-dimensional idx), then 60000 x 28 x 28.
  const std::string header("\x00\x00\x08\x04\x00\x00\xea\x60\x00\x00\x00\x1c"
                           "\x00\x00\x00\x1c",
                           16);
  const std::string images = dir.path() + "/train-images-idx3-ubyte.gz";
  WriteGz(images, header + std::string(1000, '\0'));
  const RunResult run = RunCo2Train(
      {absl::StrCat("--data_dir=", dir.path()), "--workers=1", "--steps=2"},
      /*timeout_s=*/60);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.exit_code, 124) << "timed out";
  EXPECT_THAT(run.output, HasSubstr("co2-train: error"));
  EXPECT_THAT(run.output, HasSubstr("train-images-idx3-ubyte.gz"));
  EXPECT_LT(run.took, absl::Seconds(30));
}

TEST(TrainerTest, UnreachableAggregatorFailsClearly) {
  TempDir dir;  // the failed run keeps its logs here
  const RunResult run = RunCo2Train(
      {"--aggregators=127.0.0.1:1", "--connect_timeout=3s", "--workers=2",
       "--steps=4", "--progress=false",
       absl::StrCat("--run_dir=", dir.path(), "/run")},
      /*timeout_s=*/90);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.exit_code, 124) << "timed out";
  EXPECT_THAT(run.output, HasSubstr("co2-train: error"));
  EXPECT_THAT(run.output, HasSubstr("aggregator"));
  EXPECT_THAT(run.output, HasSubstr("127.0.0.1:1"));
  EXPECT_LT(run.took, absl::Seconds(60));
}

TEST(TrainerTest, BadFlagValueFailsBeforeSpawning) {
  const RunResult run = RunCo2Train({"--algo=sgd"}, /*timeout_s=*/30);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.output, HasSubstr("unknown algorithm 'sgd'"));
  const RunResult heavy =
      RunCo2Train({"--algo=diloco", "--momentum=heavy_ball"}, /*timeout_s=*/30);
  EXPECT_NE(heavy.exit_code, 0);
  EXPECT_THAT(heavy.output, HasSubstr("--momentum is 'heavy_ball': diloco"));
  const RunResult ddp =
      RunCo2Train({"--algo=ddp", "--max_restarts=1"}, /*timeout_s=*/30);
  EXPECT_NE(ddp.exit_code, 0);
  EXPECT_THAT(ddp.output, HasSubstr("--max_restarts"));
  EXPECT_THAT(ddp.output, HasSubstr("not ddp"));
  const RunResult restart = RunCo2Train({"--restart=-1"}, /*timeout_s=*/30);
  EXPECT_NE(restart.exit_code, 0);
  EXPECT_THAT(restart.output, HasSubstr("--restart"));
  EXPECT_THAT(restart.output, HasSubstr("must be >= 0, got -1"));
  const RunResult period = RunCo2Train(
      {"--momentum=nesterov", "--momentum_period=3"}, /*timeout_s=*/30);
  EXPECT_NE(period.exit_code, 0);
  EXPECT_THAT(period.output,
              HasSubstr("momentum_period must be 0 unless momentum is "
                        "DELAYED_NESTEROV, got 3"));
  const RunResult count =
      RunCo2Train({"--workers=4", "--scale=0:2,10:5"}, /*timeout_s=*/30);
  EXPECT_NE(count.exit_code, 0);
  EXPECT_THAT(count.output,
              HasSubstr("--scale entry '10:5': the count must be in [1, 4]"));
  const RunResult order =
      RunCo2Train({"--workers=4", "--scale=10:2,5:3"}, /*timeout_s=*/30);
  EXPECT_NE(order.exit_code, 0);
  EXPECT_THAT(order.output, HasSubstr("rounds must rise, after round 10"));
  const RunResult ddp_scale =
      RunCo2Train({"--algo=ddp", "--scale=4:1"}, /*timeout_s=*/30);
  EXPECT_NE(ddp_scale.exit_code, 0);
  EXPECT_THAT(ddp_scale.output, HasSubstr("--scale needs an aggregator"));
  const RunResult nan_rate = RunCo2Train({"--link_mbit=nan"}, /*timeout_s=*/30);
  EXPECT_NE(nan_rate.exit_code, 0);
  EXPECT_THAT(nan_rate.output, HasSubstr("--link_mbit is nan"));
  EXPECT_THAT(nan_rate.output, Not(HasSubstr("worker 0 local rank 0 failed")))
      << "refused before spawning a worker";
}

// Runs co2-train with `args`, expects it to succeed with every rank
// identical after every boundary, and returns its report.
Struct ReportOfRun(const TempDir& dir, std::vector<std::string> args) {
  const std::string report = dir.path() + "/run.json";
  args.push_back(absl::StrCat("--report=", report));
  const RunResult run = RunCo2Train(args, /*timeout_s=*/300);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("identical on every rank after every boundary: yes"));
  std::ifstream in(report);
  std::stringstream text;
  text << in.rdbuf();
  Struct doc;
  CO2_EXPECT_OK(google::protobuf::util::JsonStringToMessage(text.str(), &doc))
      << text.str();
  return doc;
}

// The settings of ReportOfRun's report.
Struct SettingsOfRun(const TempDir& dir, std::vector<std::string> args) {
  return Field(ReportOfRun(dir, std::move(args)), "settings").struct_value();
}

// Eager updates with delayed Nesterov momentum, on a node of two local
// ranks: every worker starts its rounds from its own offset, and what the
// ranks must agree on after every boundary is the anchor.
TEST(TrainerTest, EagerUpdatesWithDelayedNesterovKeepTheAnchorsIdentical) {
  TempDir dir;
  const Struct settings = SettingsOfRun(
      dir, {"--algo=co2", "--workers=2", "--local_ranks=2", "--tau=4",
            "--steps=24", "--eager", "--momentum=delayed_nesterov",
            "--momentum_period=2", "--beta=0.5", "--eval_every=0",
            "--final_eval_examples=500", "--progress=false"});
  EXPECT_EQ(Field(settings, "eager").string_value(), "true");
  EXPECT_EQ(Field(settings, "carry_progress").string_value(), "false")
      << "--eager takes carried progress' place";
  EXPECT_EQ(Field(settings, "momentum").string_value(), "delayed_nesterov");
  EXPECT_EQ(Field(settings, "momentum_period").string_value(), "2");
}

// co2-train's defaults for co2 (no outer flags): the plain average with
// carried progress, applied on arrival, at Local-SGD's inner lr; on a node
// of two local ranks each worker runs from its own offset until the update
// arrives (the leader holds it next to the anchor), and the ranks agree on
// the anchor after every boundary.
TEST(TrainerTest, CarriedProgressOnArrivalKeepsTheAnchorsIdentical) {
  TempDir dir;
  const Struct report = ReportOfRun(
      dir, {"--algo=co2", "--workers=2", "--local_ranks=2", "--tau=4",
            "--steps=24", "--eval_every=0", "--final_eval_examples=500",
            "--progress=false"});
  const Struct& memory = Field(report, "memory_bytes").struct_value();
  EXPECT_EQ(Field(memory, "anchor").number_value(),
            2 * Field(memory, "params").number_value())
      << "the leader holds no start offset next to the anchor";
  const Struct& settings = Field(report, "settings").struct_value();
  EXPECT_EQ(Field(settings, "carry_progress").string_value(), "true");
  EXPECT_EQ(Field(settings, "eager").string_value(), "false");
  EXPECT_EQ(Field(settings, "apply").string_value(), "arrival");
  EXPECT_EQ(Field(settings, "alpha").string_value(), "1");
  EXPECT_EQ(Field(settings, "beta").string_value(), "0");
  EXPECT_EQ(Field(settings, "lr").string_value(), "0.002");
}

// diloco trains through the aggregator with its published outer settings
// unless they are given.
TEST(TrainerTest, DiLoCoRunsWithItsOuterDefaults) {
  TempDir dir;
  auto settings_of = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "--algo=diloco",  "--workers=2",   "--tau=4",
        "--steps=16",     "--eval_every=0", "--final_eval_examples=500",
        "--progress=false"};
    args.insert(args.end(), extra.begin(), extra.end());
    return SettingsOfRun(dir, std::move(args));
  };
  const Struct defaults = settings_of({});
  EXPECT_EQ(Field(defaults, "alpha").string_value(), "0.7");
  EXPECT_EQ(Field(defaults, "beta").string_value(), "0.9");
  EXPECT_EQ(Field(defaults, "momentum").string_value(), "nesterov");
  EXPECT_EQ(Field(defaults, "carry_progress").string_value(), "false");
  const Struct given = settings_of({"--alpha=0.4", "--beta=0.5"});
  EXPECT_EQ(Field(given, "alpha").string_value(), "0.4");
  EXPECT_EQ(Field(given, "beta").string_value(), "0.5");
}

// A run that failed by itself (not at its timeout), saying each of `says`.
void ExpectRefused(const RunResult& run, const std::vector<std::string>& says) {
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.exit_code, 124) << "timed out";
  for (const std::string& text : says) {
    EXPECT_THAT(run.output, HasSubstr(text));
  }
}

// --local_ranks=2 over 2 shards: every local rank exchanges its own shard's
// slice (co2-train's default), and the deterministic job ends bit for bit
// where the local leader alone exchanging the whole model ends; the slices
// tile the model and their bytes add up to the leader's.
TEST(TrainerTest, RankSlicesEndBitIdenticalToTheLeaderAlone) {
  const std::vector<std::string> job = {
      "--algo=co2",   "--workers=2",   "--local_ranks=2",
      "--shards=2",   "--tau=4",       "--steps=24",
      "--deterministic", "--eval_every=0", "--final_eval_examples=500",
      "--progress=false"};
  TempDir sliced_dir, alone_dir;
  const Struct sliced = ReportOfRun(sliced_dir, job);
  std::vector<std::string> off = job;
  off.push_back("--rank_slices=off");
  const Struct alone = ReportOfRun(alone_dir, off);

  const auto& sliced_ranks = Field(sliced, "ranks").list_value().values();
  const auto& alone_ranks = Field(alone, "ranks").list_value().values();
  ASSERT_EQ(sliced_ranks.size(), 4);
  ASSERT_EQ(alone_ranks.size(), 4);
  const double p =
      Field(Field(sliced, "memory_bytes").struct_value(), "params")
          .number_value() /
      sizeof(float);
  for (int worker = 0; worker < 2; ++worker) {
    double next = 0, bytes = 0;
    for (int k = 0; k < 2; ++k) {
      const Struct& rank = sliced_ranks[2 * worker + k].struct_value();
      const Struct& leader_alone = alone_ranks[2 * worker + k].struct_value();
      EXPECT_EQ(Field(rank, "final_hash").string_value(),
                Field(leader_alone, "final_hash").string_value())
          << "worker " << worker << " rank " << k;
      const auto& slice = Field(rank, "slice").list_value();
      ASSERT_EQ(slice.values_size(), 2) << "worker " << worker << " rank " << k;
      EXPECT_EQ(slice.values(0).number_value(), next);
      EXPECT_GT(slice.values(1).number_value(), next);
      next = slice.values(1).number_value();
      EXPECT_EQ(Field(Field(rank, "memory_bytes").struct_value(), "anchor")
                    .number_value(),
                2 * sizeof(float) * (slice.values(1).number_value() -
                                     slice.values(0).number_value()))
          << "the anchor and the buffer kept for its update: the slice's";
      EXPECT_FALSE(Field(leader_alone, "slice").has_list_value());
      bytes += Field(rank, "bytes_sent").number_value();
    }
    EXPECT_EQ(next, p) << "worker " << worker << "'s slices end at the model's end";
    EXPECT_EQ(bytes, Field(alone_ranks[2 * worker].struct_value(), "bytes_sent")
                         .number_value())
        << "worker " << worker;
  }
}

// Where the shards cannot be split among the local ranks the leader
// exchanges alone, and says so; --rank_slices=on refuses such a job.
TEST(TrainerTest, RankSlicesNeedAShardPerLocalRank) {
  const std::vector<std::string> job = {
      "--algo=co2",   "--workers=2",   "--local_ranks=2", "--shards=1",
      "--tau=4",      "--steps=8",     "--eval_every=0",
      "--final_eval_examples=500",     "--progress=false"};
  const RunResult fallback = RunCo2Train(job, /*timeout_s=*/300);
  ASSERT_EQ(fallback.exit_code, 0) << fallback.output;
  EXPECT_THAT(fallback.output,
              HasSubstr("exchange: the local leader, the whole model"));
  std::vector<std::string> on = job;
  on.push_back("--rank_slices=on");
  ExpectRefused(RunCo2Train(on, /*timeout_s=*/120),
                {"--rank_slices=on", "give at least 2 shards"});
  const RunResult bad = RunCo2Train({"--rank_slices=yes"}, /*timeout_s=*/30);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("--rank_slices is 'yes': auto | on | off"));
}

// With rank slices every local rank checkpoints its own slice; a resume
// that would exchange otherwise (the leader alone) is refused by name
// before it touches the shards.
TEST(TrainerTest, RankSliceCheckpointsResumeOnlyWithRankSlices) {
  TempDir dir;
  const std::string checkpoints = dir.path() + "/checkpoints";
  const std::vector<std::string> job = {
      "--algo=co2",   "--workers=2",   "--local_ranks=2", "--shards=2",
      "--tau=4",      "--steps=8",     "--eval_every=0",
      "--final_eval_examples=500",     "--progress=false",
      absl::StrCat("--checkpoint_dir=", checkpoints)};
  const RunResult run = RunCo2Train(job, /*timeout_s=*/300);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* name : {"worker-0-rank-0.pt", "worker-0-rank-1.pt",
                           "worker-1-rank-0.pt", "worker-1-rank-1.pt"}) {
    EXPECT_TRUE(std::filesystem::exists(absl::StrCat(checkpoints, "/", name)))
        << name;
  }
  EXPECT_FALSE(std::filesystem::exists(checkpoints + "/worker-0.pt"));
  std::vector<std::string> alone = job;
  alone.push_back("--resume");
  alone.push_back("--rank_slices=off");
  // Whichever rank fails first names its own file.
  ExpectRefused(RunCo2Train(alone, /*timeout_s=*/120),
                {"no worker checkpoint at",
                 ".pt, written with rank slices: resume with rank slices"});
}

// A job that grows and shrinks (--scale) with nodes exchanging rank slices:
// the joining node's ranks join together, and the leaving node's ranks
// leave at one boundary, each with the same model.
TEST(TrainerTest, RankSlicesJoinAndLeaveAsOneNode) {
  TempDir dir;
  const Struct report = ReportOfRun(
      dir, {"--algo=co2", "--workers=3", "--local_ranks=2", "--shards=2",
            "--scale=0:2,10:3,60:2", "--tau=4", "--steps=400",
            "--eval_every=0", "--final_eval_examples=500", "--progress=false"});
  const auto& ranks = Field(report, "ranks").list_value().values();
  ASSERT_EQ(ranks.size(), 6);
  const Struct& left0 = ranks[4].struct_value();
  const Struct& left1 = ranks[5].struct_value();
  ASSERT_TRUE(Field(left0, "left_at").has_number_value());
  EXPECT_EQ(Field(left0, "left_at").number_value(),
            Field(left1, "left_at").number_value());
  EXPECT_EQ(Field(left0, "final_hash").string_value(),
            Field(left1, "final_hash").string_value());
  EXPECT_EQ(Field(left0, "params_hashes").list_value().values_size(),
            Field(left1, "params_hashes").list_value().values_size());
  for (const Value& rank : ranks) {
    EXPECT_TRUE(Field(rank.struct_value(), "slice").has_list_value());
  }
}

}  // namespace
