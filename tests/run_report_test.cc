#include "apps/co2-train/run_report.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2::client {
namespace {

RankReport MakeRank(int worker, int local_rank, int rounds) {
  RankReport r;
  r.worker = worker;
  r.local_rank = local_rank;
  r.leader = local_rank == 0;
  r.steps = 2 * rounds;
  r.train_s = 10;
  r.exposed_comm_s = 1;
  r.bytes_sent = r.leader ? 1000 : 0;
  r.final_hash = "f";
  r.metric_name = "test_accuracy";
  if (worker == 0 && local_rank == 0) r.final_metrics["test_accuracy"] = 0.75;
  r.memory_bytes["total"] = 4096;
  for (int i = 0; i < rounds; ++i) {
    RankRound round;
    round.round = i;
    round.steps = 2;
    round.loss = 2.0 - 0.1 * i + worker;
    round.metric = i == 1 ? 0.5 : -1;
    round.params_hash = "h" + std::to_string(i);
    r.rounds.push_back(round);
  }
  return r;
}

TEST(RunReportTest, RankReportRoundTrips) {
  const co2::testing::TempDir temp_dir("run_report_test");
  const std::string& dir = temp_dir.path();
  const std::string path = dir + "/rank.json";
  const RankReport original = MakeRank(1, 0, 3);
  CO2_ASSERT_OK(WriteRankReport(path, original));
  auto read = ReadRankReport(path);
  CO2_ASSERT_OK(read);
  EXPECT_EQ(read->worker, 1);
  EXPECT_TRUE(read->leader);
  EXPECT_EQ(read->bytes_sent, 1000u);
  ASSERT_EQ(read->rounds.size(), 3u);
  EXPECT_EQ(read->rounds[1].metric, 0.5);
  EXPECT_EQ(read->rounds[0].metric, -1);
  EXPECT_EQ(read->rounds[2].params_hash, "h2");
  EXPECT_DOUBLE_EQ(read->rounds[2].loss, original.rounds[2].loss);
  EXPECT_EQ(read->memory_bytes.at("total"), 4096);
  std::filesystem::remove_all(dir);
}

TEST(RunReportTest, ReadRejectsGarbage) {
  const co2::testing::TempDir temp_dir("run_report_test");
  const std::string& dir = temp_dir.path();
  CO2_ASSERT_OK(WriteFileAtomically(dir + "/bad.json", "{not json"));
  EXPECT_EQ(ReadRankReport(dir + "/bad.json").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadRankReport(dir + "/missing.json").status().code(),
            absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST(RunReportTest, SummarizeMergesAndChecksConsistency) {
  std::vector<RankReport> ranks = {MakeRank(0, 0, 4), MakeRank(0, 1, 4),
                                   MakeRank(1, 0, 4), MakeRank(1, 1, 4)};
  auto summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_EQ(summary->rounds, 4);
  EXPECT_TRUE(summary->params_identical);
  EXPECT_EQ(summary->bytes_sent, 2000u);
  EXPECT_DOUBLE_EQ(summary->exposed_comm_s, 1.0);
  EXPECT_DOUBLE_EQ(summary->exposed_comm_fraction, 0.1);
  EXPECT_DOUBLE_EQ(summary->final_metrics.at("test_accuracy"), 0.75);
  // Mean over ranks of the last round's loss: workers 0 and 1 differ by 1.
  EXPECT_DOUBLE_EQ(summary->final_loss, 2.0 - 0.3 + 0.5);

  ranks[3].rounds[2].params_hash = "other";
  summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_FALSE(summary->params_identical);
  EXPECT_THAT(summary->first_difference, ::testing::HasSubstr("round 2"));

  ranks[2].rounds.pop_back();
  EXPECT_EQ(Summarize(ranks).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RunReportTest, ARestartedRankReportsTheRoundsFromItsRejoin) {
  std::vector<RankReport> ranks = {MakeRank(0, 0, 4), MakeRank(1, 0, 4)};
  ranks[0].rounds.erase(ranks[0].rounds.begin(), ranks[0].rounds.begin() + 2);
  auto summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_EQ(summary->rounds, 4);
  EXPECT_TRUE(summary->params_identical) << summary->first_difference;
  ranks[0].rounds[1].params_hash = "other";
  summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_THAT(summary->first_difference, ::testing::HasSubstr("round 3"));
  ranks[0].rounds.erase(ranks[0].rounds.begin());
  ranks[0].rounds.push_back(ranks[0].rounds[0]);  // rounds 3, 3: a gap
  EXPECT_EQ(Summarize(ranks).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A rank that healed at the boundary of round 1 continued at round 4: its
// rounds skip 2 and 3, and after that boundary it holds the parameters the
// others had after round 3's.
TEST(RunReportTest, AHealedRankSkipsToTheRoundItContinuedAt) {
  std::vector<RankReport> ranks = {MakeRank(0, 0, 6), MakeRank(1, 0, 6)};
  std::vector<RankRound>& healed = ranks[1].rounds;
  healed.erase(healed.begin() + 2, healed.begin() + 4);  // rounds 0 1 4 5
  healed[1].healed_to = 4;
  healed[1].heal_reason = "behind";
  healed[1].params_hash = "h3";
  auto summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_EQ(summary->rounds, 6);
  EXPECT_TRUE(summary->params_identical) << summary->first_difference;
  healed[1].params_hash = "h1";  // what it held before: not the anchor of 4
  summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_FALSE(summary->params_identical);
  EXPECT_THAT(summary->first_difference, ::testing::HasSubstr("round 1"));
  healed[1].healed_to.reset();  // the same gap without a heal
  EXPECT_EQ(Summarize(ranks).status().code(),
            absl::StatusCode::kInvalidArgument);

  const co2::testing::TempDir temp_dir("run_report_test");
  const std::string& dir = temp_dir.path();
  healed[1].healed_to = 4;
  CO2_ASSERT_OK(WriteRankReport(dir + "/rank.json", ranks[1]));
  auto read = ReadRankReport(dir + "/rank.json");
  CO2_ASSERT_OK(read);
  EXPECT_EQ(read->rounds[1].healed_to, 4u);
  EXPECT_EQ(read->rounds[1].heal_reason, "behind");
  EXPECT_FALSE(read->rounds[0].healed_to.has_value());
  std::filesystem::remove_all(dir);
}

TEST(RunReportTest, ARankThatLeftEndsEarlyWithItsOwnFinalModel) {
  // Worker 2 joined at round 2 and left before round 4 of 6: its rounds
  // are compared by number, its final model (the anchor it left with) is
  // not the others'.
  std::vector<RankReport> ranks = {MakeRank(0, 0, 6), MakeRank(1, 0, 6),
                                   MakeRank(2, 0, 4)};
  RankReport& left = ranks[2];
  left.rounds.erase(left.rounds.begin(), left.rounds.begin() + 2);  // 2 3
  left.final_hash = "h3";
  left.left_at = 4;
  auto summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_EQ(summary->rounds, 6);
  EXPECT_TRUE(summary->params_identical) << summary->first_difference;
  left.left_at = 5;  // its last round would be 4
  EXPECT_EQ(Summarize(ranks).status().code(),
            absl::StatusCode::kInvalidArgument);
  left.left_at.reset();  // ending early without leaving
  EXPECT_EQ(Summarize(ranks).status().code(),
            absl::StatusCode::kInvalidArgument);
  left.left_at = 4;
  ranks[1].final_hash = "g";  // the workers that stayed disagree
  summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_FALSE(summary->params_identical);
  EXPECT_THAT(summary->first_difference, ::testing::HasSubstr("worker 1"));
  EXPECT_THAT(summary->first_difference,
              ::testing::Not(::testing::HasSubstr("worker 2")));

  const co2::testing::TempDir temp_dir("run_report_test");
  const std::string& dir = temp_dir.path();
  CO2_ASSERT_OK(WriteRankReport(dir + "/rank.json", left));
  auto read = ReadRankReport(dir + "/rank.json");
  CO2_ASSERT_OK(read);
  EXPECT_EQ(read->left_at, 4u);
  CO2_ASSERT_OK(WriteRankReport(dir + "/rank.json", ranks[0]));
  read = ReadRankReport(dir + "/rank.json");
  CO2_ASSERT_OK(read);
  EXPECT_FALSE(read->left_at.has_value());
  std::filesystem::remove_all(dir);
}

// Worker 1 healed at round 4 to round 6 and reports more rounds than
// worker 0, restarted at round 2: only worker 0 ran round 5, and worker 1's
// round-4 entry holds A_6, the parameters after round 5's boundary. Every
// round of the job is counted and in the curve, round 5's parameters are
// compared between worker 0's round 5 and worker 1's healed entry, and
// worker 0's round 4 is not compared with that entry.
TEST(RunReportTest, ARoundOnlyAShorterRankRanIsCountedAndCompared) {
  std::vector<RankReport> ranks = {MakeRank(0, 0, 7), MakeRank(1, 0, 7)};
  ranks[0].rounds.erase(ranks[0].rounds.begin(), ranks[0].rounds.begin() + 2);
  std::vector<RankRound>& healed = ranks[1].rounds;
  healed.erase(healed.begin() + 5);  // 0 1 2 3 4 6
  healed[4].healed_to = 6;
  healed[4].params_hash = "h5";
  auto summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_EQ(summary->rounds, 7);
  EXPECT_TRUE(summary->params_identical) << summary->first_difference;
  // A wrong hash in the round only worker 0 ran ...
  ranks[0].rounds[3].params_hash = "bad";  // rounds 2 3 4 5 6
  summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_FALSE(summary->params_identical);
  EXPECT_THAT(summary->first_difference, ::testing::HasSubstr("round 5: "));
  EXPECT_THAT(summary->first_difference, ::testing::HasSubstr("(bad)"));
  // ... or in the healed entry that holds that round's parameters.
  ranks[0].rounds[3].params_hash = "h5";
  healed[4].params_hash = "bad";
  summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_FALSE(summary->params_identical);
  EXPECT_THAT(summary->first_difference,
              ::testing::HasSubstr("worker 1 rank 0 (bad, healed at round 4 "
                                   "to 6)"));

  // The merged report's round count and curve.
  healed[4].params_hash = "h5";
  summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  const std::string json = MergedReportJson(RunInfo{}, ranks, *summary);
  google::protobuf::Struct doc;
  CO2_ASSERT_OK(google::protobuf::util::JsonStringToMessage(json, &doc))
      << json;
  EXPECT_EQ(doc.fields().at("rounds").number_value(), 7);
  const auto& curve = doc.fields().at("curve").list_value();
  ASSERT_EQ(curve.values_size(), 7);
  for (int n = 0; n < 7; ++n) {
    EXPECT_EQ(curve.values(n).struct_value().fields().at("round").number_value(),
              n);
  }
  const auto& round5 = curve.values(5).struct_value().fields();
  EXPECT_DOUBLE_EQ(round5.at("loss").number_value(), 2.0 - 0.5);  // worker 0
  EXPECT_EQ(round5.at("params_hash").string_value(), "h5");
}

TEST(RunReportTest, ARankThatHealedInFinishEndsWithTheFinalAnchor) {
  // Worker 1 stopped in round 3 of 6 and healed in Finish's drain, to the
  // round after the last (7, the final anchor's): its rounds end at 3.
  std::vector<RankReport> ranks = {MakeRank(0, 0, 6), MakeRank(1, 0, 4)};
  ranks[1].rounds.back().healed_to = 7;
  ranks[1].rounds.back().heal_reason = "behind";
  auto summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_TRUE(summary->params_identical) << summary->first_difference;
  ranks[1].rounds.back().healed_to.reset();  // the same end without a heal
  EXPECT_EQ(Summarize(ranks).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RunReportTest, ARankRestartedAfterTheLastRoundReportsNone) {
  // Worker 0 restarted after worker 1 had run every round: it fetched the
  // final anchor and trained no round. The merge takes the curve and the
  // final loss from the ranks that ran each round, and still compares the
  // final models.
  std::vector<RankReport> ranks = {MakeRank(0, 0, 0), MakeRank(1, 0, 4)};
  ranks[0].rounds.clear();
  auto summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_EQ(summary->rounds, 4);
  EXPECT_TRUE(summary->params_identical) << summary->first_difference;
  EXPECT_DOUBLE_EQ(summary->final_loss, 2.0 - 0.3 + 1.0);
  const std::string json = MergedReportJson(RunInfo{}, ranks, *summary);
  google::protobuf::Struct doc;
  CO2_ASSERT_OK(google::protobuf::util::JsonStringToMessage(json, &doc))
      << json;
  const auto& curve = doc.fields().at("curve").list_value();
  ASSERT_EQ(curve.values_size(), 4);
  EXPECT_DOUBLE_EQ(
      curve.values(3).struct_value().fields().at("loss").number_value(),
      2.0 - 0.3 + 1.0);

  ranks[0].final_hash = "other";
  summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  EXPECT_FALSE(summary->params_identical);
  EXPECT_THAT(summary->first_difference, ::testing::HasSubstr("final model"));
  // Every rank with its hash, so that a user sees which one is off.
  for (const RankReport& r : ranks) {
    EXPECT_THAT(
        summary->first_difference,
        ::testing::HasSubstr(absl::StrCat("worker ", r.worker, " rank ",
                                          r.local_rank, " ", r.final_hash)));
  }
}

TEST(RunReportTest, CurveMatchesRoundsByNumber) {
  // Worker 0 (the lead) rejoined at round 2: its rounds 2, 3 line up with
  // worker 1's, and rounds 0, 1 come from worker 1 alone.
  std::vector<RankReport> ranks = {MakeRank(0, 0, 4), MakeRank(1, 0, 4)};
  ranks[0].rounds.erase(ranks[0].rounds.begin(), ranks[0].rounds.begin() + 2);
  auto summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  const std::string json = MergedReportJson(RunInfo{}, ranks, *summary);
  google::protobuf::Struct doc;
  CO2_ASSERT_OK(google::protobuf::util::JsonStringToMessage(json, &doc));
  const auto& curve = doc.fields().at("curve").list_value();
  ASSERT_EQ(curve.values_size(), 4);
  const auto loss = [&](int i) {
    return curve.values(i).struct_value().fields().at("loss").number_value();
  };
  EXPECT_DOUBLE_EQ(loss(0), 2.0 + 1.0);
  EXPECT_DOUBLE_EQ(loss(3), 2.0 - 0.3 + 0.5);
  EXPECT_EQ(curve.values(2).struct_value().fields().at("round").number_value(), 2);
}

TEST(RunReportTest, MergedReportIsWellFormedJson) {
  const std::vector<RankReport> ranks = {MakeRank(0, 0, 3), MakeRank(1, 0, 3)};
  auto summary = Summarize(ranks);
  CO2_ASSERT_OK(summary);
  RunInfo info;
  info.settings["algo"] = "co2";
  info.wall_s = 12.5;
  info.aggregators = {"127.0.0.1:1234"};
  const std::string json = MergedReportJson(info, ranks, *summary);
  google::protobuf::Struct doc;
  CO2_ASSERT_OK(google::protobuf::util::JsonStringToMessage(json, &doc))
      << json;
  EXPECT_EQ(doc.fields().at("wall_time_s").number_value(), 12.5);
  EXPECT_EQ(doc.fields().at("settings").struct_value().fields().at("algo")
                .string_value(),
            "co2");
  const auto& curve = doc.fields().at("curve").list_value();
  ASSERT_EQ(curve.values_size(), 3);
  // Loss averaged over ranks (worker 1's is 1 higher), metric from worker 0.
  const auto& round1 = curve.values(1).struct_value().fields();
  EXPECT_DOUBLE_EQ(round1.at("loss").number_value(), 2.0 - 0.1 + 0.5);
  EXPECT_EQ(round1.at("metric").number_value(), 0.5);
  EXPECT_EQ(curve.values(0).struct_value().fields().count("metric"), 0u);
  EXPECT_TRUE(doc.fields().at("params_identical").bool_value());
  EXPECT_EQ(doc.fields().at("ranks").list_value().values_size(), 2);
}

}  // namespace
}  // namespace co2::client
