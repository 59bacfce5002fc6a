#include "server/job/round_state.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

// A closed round's mean as one vector, its chunks back to back.
std::vector<float> Flat(const ClosedRound& closed) {
  std::vector<float> flat;
  for (const std::vector<float>& chunk : closed.mean) {
    flat.insert(flat.end(), chunk.begin(), chunk.end());
  }
  return flat;
}

using common::Codec;
using common::kChunkElements;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(10);

// Element i of a delta (shard-relative index).
using ValueFn = std::function<float(size_t)>;

ValueFn Constant(float v) {
  return [v](size_t) { return v; };
}

class RoundStateTest : public ::testing::Test {
 protected:
  void Init(size_t n, uint32_t min_workers = 1,
            RoundDeadlineOptions deadline = {}) {
    RoundOptions options;
    options.shard_elements = n;
    options.min_workers = min_workers;
    options.round_timeout = kTimeout;
    options.deadline = deadline;
    options.exact_sums = exact_sums_;
    options.rounds = rounds_;
    state_ = std::make_unique<RoundState>(options, &clock_);
  }

  absl::StatusOr<ChunkOutcome> Send(const std::string& worker, uint64_t round,
                                    uint32_t chunk, const ValueFn& value,
                                    double weight = 1.0,
                                    Codec codec = Codec::kFp32) {
    const size_t begin = size_t{chunk} * kChunkElements;
    std::vector<float> v(state_->ChunkElements(chunk));
    for (size_t i = 0; i < v.size(); ++i) v[i] = value(begin + i);
    std::string bytes(common::EncodedSize(codec, v.size()), '\0');
    common::Encode(codec, v, absl::MakeSpan(bytes.data(), bytes.size()));
    return state_->AddChunk(worker, round, chunk, codec, bytes, weight);
  }

  // Sends every chunk of `round`; each must be accepted as new.
  void SendAll(const std::string& worker, uint64_t round, const ValueFn& value,
               double weight = 1.0, Codec codec = Codec::kFp32) {
    for (uint32_t c = 0; c < state_->num_chunks(); ++c) {
      absl::StatusOr<ChunkOutcome> out =
          Send(worker, round, c, value, weight, codec);
      CO2_ASSERT_OK(out);
      EXPECT_FALSE(out->duplicate);
      EXPECT_FALSE(out->folded);
    }
  }

  // Every element of `mean` equals expected(i), exactly.
  static void ExpectMean(absl::Span<const float> mean,
                         const ValueFn& expected) {
    size_t mismatches = 0;
    for (size_t i = 0; i < mean.size(); ++i) {
      if (mean[i] != expected(i) && mismatches++ < 5) {
        ADD_FAILURE() << "mean[" << i << "] = " << mean[i] << ", expected "
                      << expected(i);
      }
    }
    EXPECT_EQ(mismatches, 0u);
  }

  void AddWorkerFor(int k) { state_->AddWorker(absl::StrCat("w", k), 0); }

  common::FakeClock clock_;
  std::unique_ptr<RoundState> state_;
  bool exact_sums_ = false;  // RoundOptions::exact_sums for the next Init
  uint64_t rounds_ = 0;      // RoundOptions::rounds for the next Init
};

// --- N workers with rank-valued deltas, swept over N and shard size. ---

class RankMeanTest
    : public RoundStateTest,
      public ::testing::WithParamInterface<std::tuple<int, size_t>> {};

TEST_P(RankMeanTest, MeanOfRanksIsHalfOfNMinusOne) {
  const auto [num_workers, n] = GetParam();
  Init(n);
  for (int k = 0; k < num_workers; ++k) AddWorkerFor(k);
  for (int k = 0; k < num_workers; ++k) {
    ASSERT_FALSE(state_->TryClose().has_value())
        << "closed before worker " << k;
    // Rank plus a position pattern, so a chunk written at the wrong offset
    // shows.
    SendAll(absl::StrCat("w", k), 0,
            [k](size_t i) { return static_cast<float>(k + i % 7); });
  }
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->round, 0u);
  EXPECT_EQ(closed->contributors, static_cast<uint32_t>(num_workers));
  EXPECT_EQ(closed->total_weight, num_workers);
  EXPECT_FALSE(closed->quorum_close);
  ASSERT_EQ(closed->mean.size(), common::NumChunks(n));
  for (uint32_t c = 0; c < closed->mean.size(); ++c) {
    EXPECT_EQ(closed->mean[c].size(), common::ChunkRange(n, c).size());
  }
  ASSERT_EQ(Flat(*closed).size(), n);
  const float half = (num_workers - 1) / 2.0f;
  ExpectMean(Flat(*closed),
             [half](size_t i) { return half + static_cast<float>(i % 7); });
  EXPECT_EQ(state_->open_round(), 1u);
  EXPECT_FALSE(state_->TryClose().has_value());
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, RankMeanTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 8),
                       ::testing::Values(size_t{1}, size_t{1000},
                                         2 * kChunkElements + 5)));

// --- Arrival order. ---

TEST_F(RoundStateTest, EveryArrivalOrderGivesTheSameMean) {
  // 3 workers × 2 chunks = 6 messages, all 720 orders, one round each on the
  // same state (so buffer reuse across rounds is exercised too).
  Init(kChunkElements + 3);
  for (int k = 0; k < 3; ++k) AddWorkerFor(k);
  const double weights[3] = {1, 2, 4};
  auto delta = [](int k, uint64_t round) {
    return [k, round](size_t i) {
      return static_cast<float>(10 * (k + 1) + i % 5 + round % 3);
    };
  };
  // Deltas repeat every 3 rounds: encode each (round % 3, worker, chunk) once.
  std::string payloads[3][3][2];
  for (int p = 0; p < 3; ++p) {
    for (int k = 0; k < 3; ++k) {
      for (uint32_t c = 0; c < 2; ++c) {
        std::vector<float> v(state_->ChunkElements(c));
        for (size_t i = 0; i < v.size(); ++i) {
          v[i] = delta(k, p)(c * kChunkElements + i);
        }
        payloads[p][k][c].resize(common::EncodedSize(Codec::kFp32, v.size()));
        common::Encode(
            Codec::kFp32, v,
            absl::MakeSpan(payloads[p][k][c].data(), payloads[p][k][c].size()));
      }
    }
  }
  std::vector<int> order(6);
  std::iota(order.begin(), order.end(), 0);
  uint64_t round = 0;
  do {
    for (size_t m = 0; m < order.size(); ++m) {
      ASSERT_FALSE(state_->TryClose().has_value()) << "round " << round;
      const int k = order[m] / 2;
      const uint32_t chunk = order[m] % 2;
      absl::StatusOr<ChunkOutcome> out =
          state_->AddChunk(absl::StrCat("w", k), round, chunk, Codec::kFp32,
                           payloads[round % 3][k][chunk], weights[k]);
      CO2_ASSERT_OK(out);
    }
    std::optional<ClosedRound> closed = state_->TryClose();
    ASSERT_TRUE(closed.has_value()) << "round " << round;
    ASSERT_EQ(closed->round, round);
    EXPECT_EQ(closed->contributors, 3u);
    EXPECT_EQ(closed->total_weight, 7.0);
    // Σ w·Δ / Σ w with integer terms: the correctly rounded quotient.
    const uint64_t r = round;
    const std::vector<float> mean = Flat(*closed);
    for (size_t i = 0; i < mean.size(); ++i) {
      float sum = 0;
      for (int k = 0; k < 3; ++k) sum += weights[k] * delta(k, r)(i);
      ASSERT_EQ(mean[i], sum / 7.0f) << "round " << r << ", i " << i;
    }
    ++round;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(round, 720u);
  EXPECT_EQ(state_->open_round(), 720u);
}

// --- Duplicates. ---

TEST_F(RoundStateTest, DuplicatesAreNotCounted) {
  Init(2 * kChunkElements);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  CO2_ASSERT_OK(Send("a", 0, 0, Constant(1)));
  absl::StatusOr<ChunkOutcome> dup = Send("a", 0, 0, Constant(100));
  CO2_ASSERT_OK(dup);
  EXPECT_TRUE(dup->duplicate);
  EXPECT_FALSE(dup->folded);
  CO2_ASSERT_OK(Send("a", 0, 1, Constant(1)));
  // A resend of round 1 before round 0 closes, too.
  CO2_ASSERT_OK(Send("a", 1, 0, Constant(6)));
  EXPECT_TRUE(Send("a", 1, 0, Constant(100))->duplicate);
  // A duplicate does not make "b" complete.
  CO2_ASSERT_OK(Send("b", 0, 0, Constant(3)));
  EXPECT_TRUE(Send("b", 0, 0, Constant(3))->duplicate);
  EXPECT_FALSE(state_->TryClose().has_value());
  CO2_ASSERT_OK(Send("b", 0, 1, Constant(3)));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->contributors, 2u);
  ExpectMean(Flat(*closed), Constant(2));

  // After close: a resend of a counted round-0 chunk is still a duplicate,
  // not a late chunk to fold.
  absl::StatusOr<ChunkOutcome> late_dup = Send("b", 0, 1, Constant(100));
  CO2_ASSERT_OK(late_dup);
  EXPECT_TRUE(late_dup->duplicate);
  EXPECT_FALSE(late_dup->folded);

  SendAll("b", 1, Constant(2));
  CO2_ASSERT_OK(Send("a", 1, 1, Constant(6)));
  closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->round, 1u);
  ExpectMean(Flat(*closed), Constant(4));
}

// Close hands the accumulator over: the mean is the caller's, untouched by
// later rounds, and the round after next (same slot) starts from zero.
TEST_F(RoundStateTest, ClosedRoundOwnsItsMean) {
  Init(2 * kChunkElements + 10);
  state_->AddWorker("a", 0);
  SendAll("a", 0, Constant(3));
  std::optional<ClosedRound> first = state_->TryClose();
  ASSERT_TRUE(first.has_value());
  SendAll("a", 1, Constant(5));
  std::optional<ClosedRound> second = state_->TryClose();
  ASSERT_TRUE(second.has_value());
  SendAll("a", 2, Constant(7));
  ExpectMean(Flat(*first), Constant(3));
  ExpectMean(Flat(*second), Constant(5));
  std::optional<ClosedRound> third = state_->TryClose();
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->round, 2u);
  ExpectMean(Flat(*third), Constant(7));
}

TEST_F(RoundStateTest, ResendOfFoldedChunkIsDuplicate) {
  Init(2 * kChunkElements);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  state_->RemoveWorker("b");  // not required: round 0 closes without it
  state_->AddWorker("b", 1);
  SendAll("a", 0, Constant(1));
  ASSERT_TRUE(state_->TryClose().has_value());
  absl::StatusOr<ChunkOutcome> folded = Send("b", 0, 1, Constant(7));
  CO2_ASSERT_OK(folded);
  EXPECT_TRUE(folded->folded);
  EXPECT_FALSE(folded->duplicate);
  absl::StatusOr<ChunkOutcome> again = Send("b", 0, 1, Constant(100));
  CO2_ASSERT_OK(again);
  EXPECT_TRUE(again->duplicate);
  SendAll("a", 1, Constant(1));
  SendAll("b", 1, Constant(1));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  // Chunk 1 holds a, b and the folded 7 once: (1 + 1 + 7) / 3.
  ExpectMean(Flat(*closed),
             [](size_t i) { return i < kChunkElements ? 1.0f : 3.0f; });
}

TEST_F(RoundStateTest, RejoinKeepsDuplicateDetection) {
  Init(2 * kChunkElements);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  CO2_ASSERT_OK(Send("a", 0, 0, Constant(1)));
  state_->RemoveWorker("a");
  EXPECT_FALSE(state_->IsLive("a"));
  state_->AddWorker("a", 0);  // restart: resends the in-flight round
  EXPECT_TRUE(state_->IsLive("a"));
  EXPECT_EQ(state_->live_workers(), 2u);
  EXPECT_TRUE(Send("a", 0, 0, Constant(100))->duplicate);
  CO2_ASSERT_OK(Send("a", 0, 1, Constant(1)));
  SendAll("b", 0, Constant(3));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  ExpectMean(Flat(*closed), Constant(2));
}

// --- Stragglers and weights. ---

TEST_F(RoundStateTest, LateChunkIsFoldedIntoNextRoundWithItsWeight) {
  Init(2 * kChunkElements, /*min_workers=*/1);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  SendAll("a", 0, Constant(1), /*weight=*/1);
  CO2_ASSERT_OK(Send("b", 0, 0, Constant(4), /*weight=*/3));
  clock_.Advance(kTimeout);
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(closed->quorum_close);
  EXPECT_EQ(closed->contributors, 1u);
  EXPECT_EQ(closed->total_weight, 1.0);
  // Chunk 0: (1·1 + 3·4) / 4; chunk 1: a alone.
  ExpectMean(Flat(*closed),
             [](size_t i) { return i < kChunkElements ? 13.0f / 4 : 1.0f; });

  // b's chunk 1 of round 0 arrives during round 1: folded, weight 3.
  absl::StatusOr<ChunkOutcome> late = Send("b", 0, 1, Constant(8), 3);
  CO2_ASSERT_OK(late);
  EXPECT_TRUE(late->folded);
  EXPECT_FALSE(late->duplicate);
  // A folded chunk neither starts the deadline nor completes b for round 1.
  EXPECT_FALSE(state_->Deadline().has_value());
  SendAll("a", 1, Constant(2), 1);
  CO2_ASSERT_OK(Send("b", 1, 0, Constant(0), 1));
  EXPECT_FALSE(state_->TryClose().has_value());
  CO2_ASSERT_OK(Send("b", 1, 1, Constant(0), 1));
  closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->round, 1u);
  EXPECT_FALSE(closed->quorum_close);
  EXPECT_EQ(closed->contributors, 2u);  // the folded chunk is no contribution
  EXPECT_EQ(closed->total_weight, 2.0);
  // Chunk 0: (1·2 + 1·0) / 2; chunk 1: (1·2 + 1·0 + 3·8) / 5.
  ExpectMean(Flat(*closed),
             [](size_t i) { return i < kChunkElements ? 1.0f : 26.0f / 5; });
}

// --- Chunks taken ahead of the round's close (a shard streaming updates). ---

TEST_F(RoundStateTest, AChunkEveryRequiredWorkerSentIsTakenAheadOnce) {
  Init(3 * kChunkElements);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  state_->AddWorker("later", 1);  // not required for round 0
  EXPECT_TRUE(state_->TakeCompleteChunks().empty());
  CO2_ASSERT_OK(Send("a", 0, 0, Constant(1)));
  CO2_ASSERT_OK(Send("a", 0, 1, Constant(1)));
  EXPECT_TRUE(state_->TakeCompleteChunks().empty()) << "b has sent nothing";
  CO2_ASSERT_OK(Send("b", 0, 1, Constant(3), /*weight=*/3));
  std::vector<CompleteChunk> taken = state_->TakeCompleteChunks();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].chunk_index, 1u);
  EXPECT_EQ(taken[0].contributors, 2u);
  ExpectMean(taken[0].mean, Constant(2.5f));  // (1·1 + 3·3) / 4
  EXPECT_TRUE(state_->TakeCompleteChunks().empty()) << "taken once";
  EXPECT_FALSE(state_->TryClose().has_value());

  // The rest of the round closes as usual; the taken chunk is not in it.
  CO2_ASSERT_OK(Send("b", 0, 0, Constant(3)));
  CO2_ASSERT_OK(Send("b", 0, 2, Constant(3)));
  CO2_ASSERT_OK(Send("a", 0, 2, Constant(1)));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->contributors, 2u);
  ASSERT_EQ(closed->mean.size(), 3u);
  ExpectMean(closed->mean[0], Constant(2));
  EXPECT_TRUE(closed->mean[1].empty());
  ExpectMean(closed->mean[2], Constant(2));
  EXPECT_TRUE(state_->TakeCompleteChunks().empty()) << "round 1: no chunk";
}

TEST_F(RoundStateTest, AWorkerWithoutARoundIsToldApart) {
  Init(1000);
  state_->AddWorker("a", 0);
  EXPECT_FALSE(state_->HasWorkerWithoutRound());
  state_->AddWorker("joining", UINT64_MAX);  // has not fetched yet
  EXPECT_TRUE(state_->HasWorkerWithoutRound());
  state_->AddWorker("joining", 3);  // fetched the anchor of round 3
  EXPECT_FALSE(state_->HasWorkerWithoutRound());
  state_->AddWorker("gone", UINT64_MAX);
  state_->RemoveWorker("gone");
  EXPECT_FALSE(state_->HasWorkerWithoutRound());
}

TEST_F(RoundStateTest, AContributionToATakenChunkIsFoldedIntoTheNextRound) {
  Init(2 * kChunkElements);
  state_->AddWorker("a", 0);
  SendAll("a", 0, Constant(1));
  ASSERT_EQ(state_->TakeCompleteChunks().size(), 2u);
  // b joins round 0 after its chunks were taken: its chunk 0 goes to round 1,
  // and counts there with its weight.
  state_->AddWorker("b", 0);
  absl::StatusOr<ChunkOutcome> late = Send("b", 0, 0, Constant(7), 2);
  CO2_ASSERT_OK(late);
  EXPECT_TRUE(late->folded);
  EXPECT_TRUE(state_->TakeCompleteChunks().empty());
  state_->RemoveWorker("b");
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(closed->mean[0].empty() && closed->mean[1].empty());
  SendAll("a", 1, Constant(1));
  std::vector<CompleteChunk> taken = state_->TakeCompleteChunks();
  ASSERT_EQ(taken.size(), 2u);
  ExpectMean(taken[0].mean, Constant(5));  // (1·1 + 2·7) / 3
  ExpectMean(taken[1].mean, Constant(1));
}

// A shard restarted mid-round restores the chunks it had taken, with who
// sent them: their resends are duplicates, another worker's contribution to
// a taken chunk goes to the next round, and the round closes with the
// weights the restored senders had.
TEST_F(RoundStateTest, ARestoredTakenChunkKnowsItsSenders) {
  Init(2 * kChunkElements);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  CO2_ASSERT_OK(Send("a", 0, 0, Constant(1), 2));
  CO2_ASSERT_OK(Send("b", 0, 0, Constant(3), 6));
  CO2_ASSERT_OK(Send("a", 0, 1, Constant(1), 2));
  ASSERT_EQ(state_->TakeCompleteChunks().size(), 1u);
  std::vector<ChunkSender> senders = state_->SendersOf(0);
  std::sort(senders.begin(), senders.end(),
            [](const ChunkSender& x, const ChunkSender& y) {
              return x.worker < y.worker;
            });
  ASSERT_EQ(senders.size(), 2u);
  EXPECT_EQ(senders[0].worker, "a");
  EXPECT_EQ(senders[0].contribution_weight, 2);
  EXPECT_EQ(senders[1].worker, "b");
  EXPECT_EQ(senders[1].contribution_weight, 6);
  EXPECT_EQ(state_->SendersOf(1).size(), 1u);

  // The restarted shard: a and b rejoin; "c" had no part in chunk 0.
  Init(2 * kChunkElements);
  for (const char* w : {"a", "b", "c"}) state_->AddWorker(w, 0);
  state_->RestoreTakenChunk(0, senders);
  absl::StatusOr<ChunkOutcome> resent = Send("a", 0, 0, Constant(1), 2);
  CO2_ASSERT_OK(resent);
  EXPECT_TRUE(resent->duplicate);
  absl::StatusOr<ChunkOutcome> other = Send("c", 0, 0, Constant(5));
  CO2_ASSERT_OK(other);
  EXPECT_TRUE(other->folded) << "chunk 0 of round 0 was stepped already";
  state_->RemoveWorker("c");
  CO2_ASSERT_OK(Send("a", 0, 1, Constant(1), 2));
  CO2_ASSERT_OK(Send("b", 0, 1, Constant(1), 6));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->contributors, 2u);
  EXPECT_EQ(closed->total_weight, 8);
  EXPECT_TRUE(closed->mean[0].empty());
  ExpectMean(closed->mean[1], Constant(1));
}

TEST_F(RoundStateTest, AWorkerThatLeavesCompletesTheChunksItDidNotSend) {
  Init(2 * kChunkElements);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  SendAll("a", 0, Constant(1));
  CO2_ASSERT_OK(Send("b", 0, 0, Constant(3)));
  std::vector<CompleteChunk> taken = state_->TakeCompleteChunks();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].chunk_index, 0u);
  state_->RemoveWorker("b");
  taken = state_->TakeCompleteChunks();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].chunk_index, 1u);
  EXPECT_EQ(taken[0].contributors, 1u);
  ExpectMean(taken[0].mean, Constant(1));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->contributors, 1u);
}

TEST_F(RoundStateTest, WeightedMeanWithUnequalWeights) {
  Init(1000);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  state_->AddWorker("c", 0);
  SendAll("a", 0, Constant(0), 1);
  SendAll("b", 0, Constant(4), 3);
  SendAll(
      "c", 0, [](size_t i) { return static_cast<float>(i); }, 4);
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->total_weight, 8.0);
  ExpectMean(Flat(*closed), [](size_t i) {
    return (3.0f * 4 + 4.0f * static_cast<float>(i)) / 8.0f;
  });
}

TEST_F(RoundStateTest, WeightsAtTheFp32LimitsGiveAFiniteMean) {
  Init(1000);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  SendAll("a", 0, Constant(1), FLT_MIN);
  SendAll("b", 0, Constant(2), FLT_MIN);
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  ExpectMean(Flat(*closed), Constant(1.5f));

  // Σ w = 1.5 · FLT_MAX is past fp32's range; the mean is still 5 / 12.
  SendAll("a", 1, Constant(0.5f), FLT_MAX);
  SendAll("b", 1, Constant(0.25f), FLT_MAX / 2);
  closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  for (float v : Flat(*closed)) ASSERT_FLOAT_EQ(v, 5.0f / 12);
}

TEST_F(RoundStateTest, SumsThatWouldOverflowAreRejectedBeforeCounting) {
  Init(1000);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  // Finite values whose weighted sum is not: one alone (FLT_MAX × 2), and
  // two that overflow together (3e38 + 3e38).
  absl::StatusOr<ChunkOutcome> alone = Send("a", 0, 0, Constant(FLT_MAX), 2.0);
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(alone.status().message(),
              HasSubstr("worker \"a\" round 0 chunk 0"));
  CO2_ASSERT_OK(Send("a", 0, 0, Constant(3e38f)));
  absl::StatusOr<ChunkOutcome> sum = Send("b", 0, 0, [](size_t i) {
    return i == 17 ? 3e38f : 1.0f;
  });
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sum.status().message(),
              HasSubstr("worker \"b\" round 0 chunk 0: element 17"));
  EXPECT_THAT(sum.status().message(), HasSubstr("is not finite"));
  // Nothing of the refused chunk was counted: b's valid resend is new, and
  // the mean holds only what was accepted.
  absl::StatusOr<ChunkOutcome> resend = Send("b", 0, 0, Constant(-1e38f));
  CO2_ASSERT_OK(resend);
  EXPECT_FALSE(resend->duplicate);
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  const float sum_ab = 3e38f + -1e38f;
  ExpectMean(Flat(*closed),
             Constant(static_cast<float>(static_cast<double>(sum_ab) / 2)));
}

TEST_F(RoundStateTest, ExactSumsTakeWeightsAtTheFp32Limits) {
  exact_sums_ = true;
  Init(1000);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  SendAll("a", 0, Constant(1), FLT_MIN);
  SendAll("b", 0, Constant(2), FLT_MIN);
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  ExpectMean(Flat(*closed), Constant(1.5f));

  // Σ w = 1.5 · FLT_MAX; the mean is 5 / 12, rounded once.
  SendAll("a", 1, Constant(0.5f), FLT_MAX);
  SendAll("b", 1, Constant(0.25f), FLT_MAX / 2);
  closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  ExpectMean(Flat(*closed), Constant(static_cast<float>(5.0 / 12)));
}

// What an fp32 sum must refuse (SumsThatWouldOverflowAreRejectedBeforeCounting)
// an exact sum adds: its mean is finite.
TEST_F(RoundStateTest, ExactSumsTakeWhatWouldOverflowFp32) {
  exact_sums_ = true;
  Init(1000);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  CO2_ASSERT_OK(Send("a", 0, 0, Constant(FLT_MAX), 2.0));
  CO2_ASSERT_OK(Send("b", 0, 0, Constant(3e38f)));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  ExpectMean(Flat(*closed),
             Constant(static_cast<float>(
                 (2.0 * FLT_MAX + static_cast<double>(3e38f)) / 3)));
}

// The proof of order independence on a shard: the same contributions (five
// workers, three codecs, weights from 1 to 10^5, values over 40 binades,
// three chunks) fed in 40 random orders, with chunks taken ahead at random
// points, give the same mean bits every time with exact sums; the fp32 sums of
// the same orders differ (the data is one where order matters).
TEST_F(RoundStateTest, AnyArrivalOrderGivesTheSameBitsWithExactSums) {
  const size_t n = 2 * kChunkElements + 999;
  const Codec codecs[] = {Codec::kFp32, Codec::kBf16, Codec::kInt8};
  struct Chunk {
    std::string worker;
    uint32_t index;
    Codec codec;
    std::string bytes;
    double weight;
  };
  std::vector<Chunk> chunks;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 10);
  Init(n);
  for (int k = 0; k < 5; ++k) {
    const Codec codec = codecs[k % 3];
    const double weight = std::round(std::exp2(k * 4.0) * 1.7);
    for (uint32_t c = 0; c < state_->num_chunks(); ++c) {
      std::vector<float> v(state_->ChunkElements(c));
      for (float& x : v) x = std::ldexp(normal(rng), exponent(rng));
      std::string bytes(common::EncodedSize(codec, v.size()), '\0');
      common::Encode(codec, v, absl::MakeSpan(bytes.data(), bytes.size()));
      chunks.push_back(Chunk{absl::StrCat("w", k), c, codec, bytes, weight});
    }
  }
  // The means of 40 orders, bit for bit: how many differ from the first.
  auto orders_that_differ = [&](bool exact) {
    exact_sums_ = exact;
    std::vector<float> first;
    int differ = 0;
    for (int trial = 0; trial < 40; ++trial) {
      Init(n);
      for (int k = 0; k < 5; ++k) AddWorkerFor(k);
      std::shuffle(chunks.begin(), chunks.end(), rng);
      std::vector<std::vector<float>> mean(state_->num_chunks());
      for (const Chunk& chunk : chunks) {
        CO2_EXPECT_OK(state_->AddChunk(chunk.worker, 0, chunk.index,
                                       chunk.codec, chunk.bytes, chunk.weight));
        if (rng() % 2 == 0) {
          for (CompleteChunk& taken : state_->TakeCompleteChunks()) {
            mean[taken.chunk_index] = std::move(taken.mean);
          }
        }
      }
      std::optional<ClosedRound> closed = state_->TryClose();
      if (!closed.has_value()) return -1;
      std::vector<float> flat;
      for (uint32_t c = 0; c < state_->num_chunks(); ++c) {
        const std::vector<float>& m =
            mean[c].empty() ? closed->mean[c] : mean[c];
        flat.insert(flat.end(), m.begin(), m.end());
      }
      EXPECT_EQ(flat.size(), n);
      if (trial == 0) {
        first = flat;
      } else if (std::memcmp(flat.data(), first.data(), n * sizeof(float))) {
        ++differ;
      }
    }
    return differ;
  };
  EXPECT_EQ(orders_that_differ(true), 0);
  EXPECT_GT(orders_that_differ(false), 0);
}

TEST_F(RoundStateTest, Bf16AndFp32ContributionsMix) {
  Init(kChunkElements + 17);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  // Small integers are exact in bf16.
  SendAll(
      "a", 0, [](size_t i) { return static_cast<float>(i % 11); }, 1,
      Codec::kBf16);
  SendAll("b", 0, Constant(3), 1, Codec::kFp32);
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  ExpectMean(Flat(*closed), [](size_t i) {
    return (static_cast<float>(i % 11) + 3.0f) / 2.0f;
  });
}

// --- Deadlines and quorum. ---

TEST_F(RoundStateTest, PartialContributionClosesAtDeadlineWithQuorum) {
  Init(2 * kChunkElements, /*min_workers=*/2);
  for (const char* w : {"a", "b", "c"}) state_->AddWorker(w, 0);
  EXPECT_FALSE(state_->Deadline().has_value());
  const absl::Time start = clock_.Now();
  clock_.Advance(absl::Seconds(1));
  SendAll("a", 0, Constant(1));
  EXPECT_EQ(state_->Deadline(), start + absl::Seconds(1) + kTimeout);
  clock_.Advance(absl::Seconds(2));
  SendAll("b", 0, Constant(2));
  EXPECT_EQ(state_->Deadline(), start + absl::Seconds(1) + kTimeout);
  CO2_ASSERT_OK(Send("c", 0, 1, Constant(6)));
  EXPECT_FALSE(state_->TryClose().has_value());
  clock_.Advance(kTimeout - absl::Seconds(2) - absl::Nanoseconds(1));
  EXPECT_FALSE(state_->TryClose().has_value());
  clock_.Advance(absl::Nanoseconds(1));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(closed->quorum_close);
  EXPECT_EQ(closed->contributors, 2u);
  EXPECT_EQ(closed->total_weight, 2.0);
  EXPECT_EQ(state_->quorum_misses(), 0u);
  // c's chunk 1 counts with its weight; chunk 0 is a and b only.
  ExpectMean(Flat(*closed),
             [](size_t i) { return i < kChunkElements ? 1.5f : 3.0f; });
  // c's missing chunk 0 of round 0 is folded, its chunk 1 is a duplicate.
  EXPECT_TRUE(Send("c", 0, 0, Constant(1))->folded);
  EXPECT_TRUE(Send("c", 0, 1, Constant(1))->duplicate);
}

// With an adaptive deadline, rounds whose last worker comes 0.5 s after the
// first teach the shard to wait 4 × 0.5 s, not the whole timeout, for a worker
// that stopped; a quorum close teaches it nothing.
TEST_F(RoundStateTest, AnAdaptedDeadlineDropsADeadWorkerInSeconds) {
  RoundDeadlineOptions adaptive;
  adaptive.adaptive = true;
  adaptive.factor = 4;
  adaptive.window = 8;
  adaptive.min_samples = 3;
  adaptive.floor = absl::Seconds(1);
  Init(1000, /*min_workers=*/1, adaptive);
  for (const char* w : {"a", "b"}) state_->AddWorker(w, 0);
  for (uint64_t round = 0; round < 3; ++round) {
    EXPECT_EQ(state_->RoundTimeout(), kTimeout) << round;
    SendAll("a", round, Constant(1));
    clock_.Advance(absl::Milliseconds(500));
    SendAll("b", round, Constant(3));
    std::optional<ClosedRound> closed = state_->TryClose();
    ASSERT_TRUE(closed.has_value()) << round;
    EXPECT_FALSE(closed->quorum_close);
  }
  EXPECT_EQ(state_->RoundTimeout(), absl::Seconds(2));
  // b stops: round 3 waits 2 s for it, then closes with a alone.
  const absl::Time first = clock_.Now();
  SendAll("a", 3, Constant(1));
  EXPECT_EQ(state_->Deadline(), first + absl::Seconds(2));
  clock_.Advance(absl::Seconds(2) - absl::Nanoseconds(1));
  EXPECT_FALSE(state_->TryClose().has_value());
  clock_.Advance(absl::Nanoseconds(1));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(closed->quorum_close);
  EXPECT_EQ(closed->contributors, 1u);
  EXPECT_EQ(state_->RoundTimeout(), absl::Seconds(2));
}

// A worker a round closed without at its deadline (stopped, cut off, dead
// until its lease expires) costs the job that one deadline: the next rounds
// close as soon as the others are in, until it sends again.
TEST_F(RoundStateTest, AWorkerARoundClosedWithoutIsNotWaitedForUntilItSendsAgain) {
  Init(2 * kChunkElements);
  for (const char* w : {"a", "b", "c"}) state_->AddWorker(w, 0);
  SendAll("a", 0, Constant(1));
  SendAll("b", 0, Constant(3));
  clock_.Advance(kTimeout);
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(closed->quorum_close);

  SendAll("a", 1, Constant(1));
  EXPECT_FALSE(state_->TryClose().has_value());  // b is still waited for
  SendAll("b", 1, Constant(3));
  closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_FALSE(closed->quorum_close);
  EXPECT_EQ(closed->contributors, 2u);
  ExpectMean(Flat(*closed), Constant(2));
  EXPECT_EQ(state_->live_workers(), 3u);

  // c's round 1 arrives (folded into round 2): it is waited for again.
  EXPECT_TRUE(Send("c", 1, 0, Constant(5))->folded);
  SendAll("a", 2, Constant(1));
  SendAll("b", 2, Constant(3));
  EXPECT_TRUE(state_->TakeCompleteChunks().empty());
  EXPECT_FALSE(state_->TryClose().has_value());
  SendAll("c", 2, Constant(2));
  closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_FALSE(closed->quorum_close);
  EXPECT_EQ(closed->contributors, 3u);
}

TEST_F(RoundStateTest, DeadlineWithoutQuorumCountsOneMissThenCloses) {
  Init(1000, /*min_workers=*/2);
  for (const char* w : {"a", "b", "c"}) state_->AddWorker(w, 0);
  SendAll("a", 0, Constant(1));
  clock_.Advance(kTimeout);
  EXPECT_FALSE(state_->TryClose().has_value());
  EXPECT_EQ(state_->quorum_misses(), 1u);
  clock_.Advance(absl::Seconds(30));
  EXPECT_FALSE(state_->TryClose().has_value());
  EXPECT_EQ(state_->quorum_misses(), 1u);  // once per round
  SendAll("b", 0, Constant(3));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(closed->quorum_close);  // c is still missing
  EXPECT_EQ(closed->contributors, 2u);
  ExpectMean(Flat(*closed), Constant(2));

  // The next round misses on its own account.
  EXPECT_FALSE(state_->Deadline().has_value());
  SendAll("c", 1, Constant(1));
  clock_.Advance(kTimeout);
  EXPECT_FALSE(state_->TryClose().has_value());
  EXPECT_EQ(state_->quorum_misses(), 2u);
}

TEST_F(RoundStateTest, NeverClosesWithoutACompleteContribution) {
  Init(2 * kChunkElements, /*min_workers=*/0);
  state_->AddWorker("a", 0);
  CO2_ASSERT_OK(Send("a", 0, 0, Constant(1)));
  clock_.Advance(kTimeout);
  EXPECT_FALSE(state_->TryClose().has_value());
  EXPECT_EQ(state_->quorum_misses(), 1u);
  state_->RemoveWorker("a");
  EXPECT_FALSE(state_->TryClose().has_value());
  EXPECT_EQ(state_->open_round(), 0u);
}

// Every worker healed: each left the rounds and joined again at the round
// after the open one (the anchor it fetched starts that round). Nothing can
// complete the open round, so it closes with no contributions (mean 0),
// once none of them is still without a round; the next one needs them all.
// Only in a job that states its rounds, and never past the last.
TEST_F(RoundStateTest, ARoundNoLiveWorkerTakesPartInClosesEmpty) {
  rounds_ = 3;
  Init(2 * kChunkElements);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  SendAll("a", 0, Constant(1));
  SendAll("b", 0, Constant(3));
  ASSERT_TRUE(state_->TryClose().has_value());
  state_->RemoveWorker("a");
  state_->RemoveWorker("b");
  state_->AddWorker("a", 2);
  state_->AddWorker("b", UINT64_MAX);  // joined, not fetched yet
  EXPECT_FALSE(state_->TryClose().has_value());
  state_->AddWorker("b", 2);
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->round, 1u);
  EXPECT_EQ(closed->contributors, 0u);
  EXPECT_FALSE(closed->quorum_close);
  ExpectMean(Flat(*closed), Constant(0));
  EXPECT_FALSE(state_->TryClose().has_value());  // round 2 needs both
  SendAll("a", 2, Constant(1));
  SendAll("b", 2, Constant(3));
  closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->contributors, 2u);
  ExpectMean(Flat(*closed), Constant(2));
  // Past the last round (2) nothing closes, even with no one required.
  state_->AddWorker("a", 4);
  state_->AddWorker("b", 4);
  EXPECT_FALSE(state_->TryClose().has_value());
  EXPECT_EQ(state_->open_round(), 3u);
  // Nor in a job that does not state its rounds: a worker that joined
  // after the last round looks the same.
  rounds_ = 0;
  Init(1000);
  state_->AddWorker("a", 0);
  SendAll("a", 0, Constant(1));
  ASSERT_TRUE(state_->TryClose().has_value());
  state_->AddWorker("late", 2);
  state_->RemoveWorker("a");
  EXPECT_FALSE(state_->TryClose().has_value());
  EXPECT_EQ(state_->open_round(), 1u);
}

TEST_F(RoundStateTest, NextRoundDeadlineStartsWhenItOpens) {
  Init(1000);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  SendAll("a", 0, Constant(1));
  SendAll("a", 1, Constant(5));  // round 1 already holds a chunk
  EXPECT_EQ(state_->Deadline(), clock_.Now() + kTimeout);
  clock_.Advance(absl::Seconds(4));
  SendAll("b", 0, Constant(3));
  const absl::Time closed_at = clock_.Now();
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  ExpectMean(Flat(*closed), Constant(2));
  EXPECT_EQ(state_->Deadline(), closed_at + kTimeout);
  SendAll("b", 1, Constant(7));
  closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->round, 1u);
  ExpectMean(Flat(*closed), Constant(6));
  EXPECT_FALSE(state_->Deadline().has_value());  // round 2 holds nothing
}

// --- Membership. ---

TEST_F(RoundStateTest, RemoveWorkerCompletesTheRound) {
  Init(2 * kChunkElements);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  SendAll("a", 0, Constant(1));
  CO2_ASSERT_OK(Send("b", 0, 0, Constant(5)));
  EXPECT_FALSE(state_->TryClose().has_value());
  state_->RemoveWorker("b");
  EXPECT_EQ(state_->live_workers(), 1u);
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_FALSE(closed->quorum_close);
  EXPECT_EQ(closed->contributors, 1u);
  // b's counted chunk stays counted.
  ExpectMean(Flat(*closed),
             [](size_t i) { return i < kChunkElements ? 3.0f : 1.0f; });
  absl::StatusOr<ChunkOutcome> gone = Send("b", 0, 1, Constant(1));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RoundStateTest, DepartedWorkersCompleteContributionCounts) {
  Init(1000);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  SendAll("b", 0, Constant(4));
  state_->RemoveWorker("b");
  EXPECT_FALSE(state_->TryClose().has_value());
  SendAll("a", 0, Constant(2));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->contributors, 2u);
  ExpectMean(Flat(*closed), Constant(3));
}

TEST_F(RoundStateTest, WorkerIsNotRequiredBeforeItsFirstRound) {
  Init(1000);
  state_->AddWorker("a", 0);
  state_->AddWorker("late", 1);
  SendAll("a", 0, Constant(1));
  std::optional<ClosedRound> closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->contributors, 1u);
  SendAll("a", 1, Constant(1));
  EXPECT_FALSE(state_->TryClose().has_value());  // round 1 needs "late"
  SendAll("late", 1, Constant(3));
  closed = state_->TryClose();
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->contributors, 2u);
  ExpectMean(Flat(*closed), Constant(2));
  // Calling AddWorker again moves first_round.
  state_->AddWorker("late", 5);
  SendAll("a", 2, Constant(1));
  EXPECT_TRUE(state_->TryClose().has_value());
}

TEST_F(RoundStateTest, RoundsAdvanceContiguously) {
  Init(2 * kChunkElements + 5);
  state_->AddWorker("a", 0);
  state_->AddWorker("b", 0);
  for (uint64_t r = 0; r < 6; ++r) {
    ASSERT_EQ(state_->open_round(), r);
    const float base = static_cast<float>(10 * r);
    SendAll("a", r, [base](size_t i) { return base + (i % 3); });
    SendAll("b", r, [base](size_t i) { return base + 2 + (i % 3); });
    std::optional<ClosedRound> closed = state_->TryClose();
    ASSERT_TRUE(closed.has_value());
    EXPECT_EQ(closed->round, r);
    // Each round reuses a buffer that held an earlier mean: nothing leaks.
    ExpectMean(Flat(*closed), [base](size_t i) {
      return base + 1 + static_cast<float>(i % 3);
    });
    EXPECT_FALSE(state_->TryClose().has_value());
  }
  EXPECT_EQ(state_->open_round(), 6u);
}

TEST_F(RoundStateTest, MultiChunkShardHasShortLastChunk) {
  Init(2 * kChunkElements + 5);
  EXPECT_EQ(state_->num_chunks(), 3u);
  EXPECT_EQ(state_->ChunkElements(0), kChunkElements);
  EXPECT_EQ(state_->ChunkElements(1), kChunkElements);
  EXPECT_EQ(state_->ChunkElements(2), 5u);
  EXPECT_EQ(state_->ChunkElements(3), 0u);
}

TEST_F(RoundStateTest, EmptyShardNeverCloses) {
  Init(0);
  state_->AddWorker("a", 0);
  EXPECT_EQ(state_->num_chunks(), 0u);
  EXPECT_FALSE(state_->TryClose().has_value());
  absl::StatusOr<ChunkOutcome> out =
      state_->AddChunk("a", 0, 0, Codec::kFp32, "", 1.0);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "chunk_index 0 out of range: shard has 0 chunks");
}

// --- Validation. ---

TEST_F(RoundStateTest, RejectsRoundsOutsideTheWindow) {
  Init(1000);
  state_->AddWorker("a", 0);
  absl::StatusOr<ChunkOutcome> ahead = Send("a", 2, 0, Constant(1));
  EXPECT_EQ(ahead.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ahead.status().message(),
            "round 2 is ahead of open round 0 (accepted 0..1)");
  for (uint64_t r = 0; r < 7; ++r) {
    SendAll("a", r, Constant(1));
    ASSERT_TRUE(state_->TryClose().has_value());
  }
  ASSERT_EQ(state_->open_round(), 7u);
  absl::StatusOr<ChunkOutcome> stale = Send("a", 3, 0, Constant(1));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(stale.status().message(),
            "round 3 is stale: open round is 7 (accepted 6..8)");
  stale = Send("a", 5, 0, Constant(1));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  ahead = Send("a", 12, 0, Constant(1));
  EXPECT_EQ(ahead.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ahead.status().message(),
            "round 12 is ahead of open round 7 (accepted 6..8)");
  ahead = Send("a", 9, 0, Constant(1));
  EXPECT_EQ(ahead.status().code(), absl::StatusCode::kFailedPrecondition);
  CO2_EXPECT_OK(Send("a", 8, 0, Constant(1)));
  EXPECT_TRUE(Send("a", 6, 0, Constant(1))->duplicate);
}

TEST_F(RoundStateTest, RejectsUnknownAndDepartedWorkers) {
  Init(1000);
  state_->AddWorker("a", 0);
  absl::StatusOr<ChunkOutcome> out = Send("w3", 0, 0, Constant(1));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(out.status().message(),
            "worker \"w3\" is not a live member of this job");
  state_->RemoveWorker("a");
  state_->RemoveWorker("a");  // idempotent
  EXPECT_EQ(state_->live_workers(), 0u);
  out = Send("a", 0, 0, Constant(1));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RoundStateTest, RejectsBadChunkIndexWeightAndPayload) {
  Init(3 * kChunkElements + 1);
  state_->AddWorker("a", 0);
  const std::string one_chunk(4 * kChunkElements, '\0');
  auto add = [&](uint32_t chunk, double weight, const std::string& bytes) {
    return state_->AddChunk("a", 0, chunk, Codec::kFp32, bytes, weight);
  };
  absl::StatusOr<ChunkOutcome> out = add(9, 1.0, one_chunk);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "chunk_index 9 out of range: shard has 4 chunks");
  out = add(4, 1.0, one_chunk);
  EXPECT_EQ(out.status().message(),
            "chunk_index 4 out of range: shard has 4 chunks");

  const struct {
    double weight;
    const char* text;
  } bad_weights[] = {
      {std::numeric_limits<double>::quiet_NaN(), "nan"},
      {std::numeric_limits<double>::infinity(), "inf"},
      {-std::numeric_limits<double>::infinity(), "-inf"},
      {0.0, "0"},
      {-1.0, "-1"},
  };
  for (const auto& bad : bad_weights) {
    out = add(0, bad.weight, one_chunk);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(out.status().message(),
              absl::StrCat("weight must be finite and > 0, got ", bad.text));
  }
  for (double weight : {1e-300, 1e300}) {
    out = add(0, weight, one_chunk);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(out.status().message(), HasSubstr("outside the fp32 range"));
  }

  out = add(3, 1.0, one_chunk);  // the last chunk holds 1 element
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            absl::StrCat("payload of chunk 3 is ", 4 * kChunkElements,
                         " bytes, expected 4 for 1 fp32 elements"));
  out = state_->AddChunk("a", 0, 0, Codec::kBf16, one_chunk, 1.0);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  out = state_->AddChunk("a", 0, 0, static_cast<Codec>(7), one_chunk, 1.0);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);

  // Nothing above was counted: the valid chunk is new.
  out = add(0, 1.0, one_chunk);
  CO2_ASSERT_OK(out);
  EXPECT_FALSE(out->duplicate);
}

}  // namespace
}  // namespace co2::server
