#include "server/job/update_sinks.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace co2::server {
namespace {

class NullSink : public UpdateSink {
 public:
  void Send(std::shared_ptr<const UpdateChunks>) override {}
  void Replay(const KeptUpdate&) override {}
};

TEST(UpdateSinksTest, LiveSinksInOrderAndEndedOnesForgotten) {
  UpdateSinks sinks;
  EXPECT_TRUE(sinks.Live().empty());
  auto a = std::make_shared<NullSink>();
  auto b = std::make_shared<NullSink>();
  auto c = std::make_shared<NullSink>();
  sinks.Add(a);
  sinks.Add(b);
  sinks.Add(c);
  sinks.Add(std::weak_ptr<UpdateSink>());  // a stream that never was
  EXPECT_EQ(sinks.Live(), (std::vector<std::shared_ptr<UpdateSink>>{a, b, c}));
  std::weak_ptr<NullSink> ended = b;
  b.reset();  // the stream ended
  EXPECT_TRUE(ended.expired()) << "a sink is held only while it is taken";
  EXPECT_EQ(sinks.Live(), (std::vector<std::shared_ptr<UpdateSink>>{a, c}));
  a.reset();
  c.reset();
  EXPECT_TRUE(sinks.Live().empty());
}

}  // namespace
}  // namespace co2::server
