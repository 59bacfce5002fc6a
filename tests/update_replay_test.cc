// A worker whose stream broke reconnects and is replayed the updates it
// missed, over real gRPC against a real shard that checkpoints every round:
// the shard keeps sent updates in their checkpoints, not in memory, and reads
// them back chunk by chunk as the new stream sends them.
#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "co2/v1/aggregator.grpc.pb.h"
#include "common/codec.h"
#include "common/job_config.h"
#include "common/layout.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/job/job_registry.h"
#include "server/job/job_shard.h"
#include "server/service/aggregator_server.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"
#include "tests/wait_for.h"

namespace co2 {
namespace {

// Three chunks, so that a replay is read back in several pieces.
constexpr size_t kParams = 2 * common::kChunkElements + 1000;

class UpdateReplayTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(); }

  // Starts the shard on a free port, from the checkpoints in dir_.
  void StartServer() {
    server::AggregatorServerOptions options;
    options.address = "127.0.0.1:0";
    options.registry.checkpoint_dir = dir_;
    options.registry.shard.stream_updates = StreamUpdates();
    auto s = server::AggregatorServer::Start(options);
    CO2_ASSERT_OK(s);
    server_ = *std::move(s);
    stub_ = v1::Aggregator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                            grpc::InsecureChannelCredentials()));
  }

  void TearDown() override { server_.reset(); }

  virtual bool StreamUpdates() const { return true; }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    return context;
  }

  // Joins worker "a" alone (quorum 1) and seeds A_0 = 0.
  void JoinAndSeed() {
    v1::JoinRequest join;
    join.set_job("j");
    join.set_worker_id("a");
    *join.mutable_config() = common::DefaultJobConfig(kParams, 1);
    join.mutable_config()->set_min_workers(1);
    join.set_uplink_codec(v1::CODEC_FP32);
    v1::JoinResponse joined;
    CO2_ASSERT_OK(stub_->Join(Context().get(), join, &joined));
    auto context = Context();
    v1::SeedResponse seeded;
    auto writer = stub_->Seed(context.get(), &seeded);
    for (uint32_t c = 0; c < common::NumChunks(kParams); ++c) {
      v1::AnchorChunk chunk;
      chunk.set_job("j");
      chunk.set_worker_id("a");
      chunk.set_chunk_index(c);
      chunk.set_payload(std::string(
          common::ChunkRange(kParams, c).size() * sizeof(float), '\0'));
      ASSERT_TRUE(writer->Write(chunk));
    }
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    CO2_ASSERT_OK(status);
  }

  static v1::ExchangeRequest Open(uint64_t replay_from) {
    v1::ExchangeRequest open;
    open.mutable_open()->set_job("j");
    open.mutable_open()->set_worker_id("a");
    open.mutable_open()->set_replay_from_round(replay_from);
    return open;
  }

  // Contributes rounds 0..rounds−1 in lockstep on one stream; returns every
  // update chunk it was sent, in order.
  std::vector<v1::OuterUpdate> Train(uint64_t rounds) {
    auto context = Context();
    auto stream = stub_->Exchange(context.get());
    EXPECT_TRUE(stream->Write(Open(0)));
    std::vector<v1::OuterUpdate> received;
    for (uint64_t r = 0; r < rounds; ++r) {
      for (uint32_t c = 0; c < common::NumChunks(kParams); ++c) {
        const size_t n = common::ChunkRange(kParams, c).size();
        std::vector<float> delta(n);
        for (size_t i = 0; i < n; ++i) delta[i] = 0.001f * (i % 97) - 0.01f * r;
        v1::ExchangeRequest request;
        v1::Contribution* contribution = request.mutable_contribution();
        contribution->set_round(r);
        contribution->set_chunk_index(c);
        contribution->set_codec(v1::CODEC_FP32);
        contribution->set_weight(1.0);
        contribution->set_payload(std::string(
            reinterpret_cast<const char*>(delta.data()), n * sizeof(float)));
        EXPECT_TRUE(stream->Write(request));
      }
      v1::OuterUpdate update;
      while (stream->Read(&update)) {
        received.push_back(update);
        if (update.chunk_index() + 1 == update.num_chunks()) break;
      }
    }
    stream->WritesDone();
    v1::OuterUpdate rest;
    while (stream->Read(&rest)) {
    }
    CO2_EXPECT_OK(stream->Finish());
    return received;
  }

  // Opens a stream asking for the updates from `from`; reads `chunks` of
  // them, then closes. `status` receives how the stream ended.
  std::vector<v1::OuterUpdate> Reconnect(uint64_t from, size_t chunks,
                                         grpc::Status* status) {
    auto context = Context();
    auto stream = stub_->Exchange(context.get());
    EXPECT_TRUE(stream->Write(Open(from)));
    std::vector<v1::OuterUpdate> received;
    v1::OuterUpdate update;
    while (received.size() < chunks && stream->Read(&update)) {
      received.push_back(update);
    }
    stream->WritesDone();
    while (stream->Read(&update)) {
    }
    *status = stream->Finish();
    return received;
  }

  // A stream replaying from round 1 is sent the updates of rounds 1 and 2
  // of the three `sent`, field by field.
  void ExpectReplayOfRoundsOneAndTwo(const std::vector<v1::OuterUpdate>& sent) {
    const uint32_t chunks = common::NumChunks(kParams);
    grpc::Status status;
    const std::vector<v1::OuterUpdate> replayed =
        Reconnect(1, 2 * chunks, &status);
    CO2_EXPECT_OK(status);
    ASSERT_EQ(replayed.size(), 2u * chunks);
    for (size_t i = 0; i < replayed.size(); ++i) {
      const v1::OuterUpdate& want = sent[chunks + i];
      EXPECT_EQ(replayed[i].round(), want.round()) << i;
      EXPECT_EQ(replayed[i].anchor_round(), want.anchor_round()) << i;
      EXPECT_EQ(replayed[i].chunk_index(), want.chunk_index()) << i;
      EXPECT_EQ(replayed[i].num_chunks(), want.num_chunks()) << i;
      EXPECT_EQ(replayed[i].contributors(), want.contributors()) << i;
      EXPECT_EQ(replayed[i].codec(), want.codec()) << i;
      EXPECT_TRUE(replayed[i].payload() == want.payload()) << "chunk " << i;
    }
  }

  const co2::testing::TempDir temp_dir_{"co2-replay"};
  const std::string dir_ = temp_dir_.path();
  std::unique_ptr<server::AggregatorServer> server_;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
};

TEST_F(UpdateReplayTest, AReconnectingWorkerGetsTheBytesItMissed) {
  JoinAndSeed();
  const std::vector<v1::OuterUpdate> sent = Train(3);
  const uint32_t chunks = common::NumChunks(kParams);
  ASSERT_EQ(sent.size(), 3u * chunks);
  // Round 2's chunks may all have been streamed before it closed; until it
  // does, round 0 is still one of the last two closed rounds.
  absl::StatusOr<std::shared_ptr<server::JobShard>> job =
      server_->registry()->Find("j");
  CO2_ASSERT_OK(job);
  testing::WaitFor([&] { return (*job)->stats().rounds_closed >= 3; },
                   absl::Seconds(20));
  ASSERT_EQ((*job)->stats().rounds_closed, 3u);
  // max_staleness = 1: the last two rounds are kept for replay.
  ExpectReplayOfRoundsOneAndTwo(sent);
}

// Rounds close whole: Train returns once the last round's checkpoint is
// durable (its update is sent only then).
class RestartReplayTest : public UpdateReplayTest {
 protected:
  bool StreamUpdates() const override { return false; }
};

TEST_F(RestartReplayTest, ARestartedShardReplaysTheLastTwoUpdatesAndNoOlder) {
  JoinAndSeed();
  const std::vector<v1::OuterUpdate> sent = Train(3);
  const uint32_t chunks = common::NumChunks(kParams);
  ASSERT_EQ(sent.size(), 3u * chunks);
  server_.reset();
  StartServer();
  // The worker resumes at round 3: the shard holds the updates of rounds 1
  // and 2, as it did before the restart.
  v1::JoinRequest join;
  join.set_job("j");
  join.set_worker_id("a");
  *join.mutable_config() = common::DefaultJobConfig(kParams, 1);
  join.mutable_config()->set_min_workers(1);
  join.set_uplink_codec(v1::CODEC_FP32);
  join.set_resume_round(3);
  v1::JoinResponse joined;
  const grpc::Status rejoined = stub_->Join(Context().get(), join, &joined);
  CO2_ASSERT_OK(rejoined);
  EXPECT_EQ(joined.open_round(), 3u);
  ASSERT_EQ(joined.oldest_update_round(), 1u);
  ExpectReplayOfRoundsOneAndTwo(sent);
  grpc::Status status;
  // Round 0's update is gone: asked for, it is refused, never skipped.
  const std::vector<v1::OuterUpdate> none = Reconnect(0, 1, &status);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << status.error_message();
  EXPECT_NE(status.error_message().find(
                "replay_from_round 0 is older than the oldest update shard 0 "
                "holds for job \"j\" (round 1"),
            std::string::npos)
      << status.error_message();
}

// Rounds close whole: Train then returns only once the last update is
// published, so in its checkpoint file (a chunk streamed ahead of the close
// can reach the worker while the checkpoint is still being written).
class UnreadableReplayTest : public UpdateReplayTest {
 protected:
  bool StreamUpdates() const override { return false; }
};

TEST_F(UnreadableReplayTest,
       AnUpdateThatCannotBeReadBackEndsTheStreamSayingWhy) {
  JoinAndSeed();
  Train(2);
  // The last update is in the job's current checkpoint file; cut it short.
  const std::string file = absl::StrCat(dir_, "/j.shard-0-of-1.ckpt");
  ASSERT_EQ(::truncate(file.c_str(), 100), 0) << file;
  grpc::Status status;
  const std::vector<v1::OuterUpdate> replayed = Reconnect(1, 1, &status);
  EXPECT_TRUE(replayed.empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS)
      << status.error_message();
  EXPECT_NE(status.error_message().find(file), std::string::npos)
      << status.error_message();
}

}  // namespace
}  // namespace co2
