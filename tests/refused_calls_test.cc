// RefusedCalls: every refusal is counted, the log gets at most one line per
// interval naming the peer, and the next line says how many it left out.
#include "server/service/refused_calls.h"

#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace co2::server {
namespace {

class CountingObserver : public ShardObserver {
 public:
  void OnCallRefused(absl::StatusCode code) override { codes.push_back(code); }
  std::vector<absl::StatusCode> codes;
};

TEST(RefusedCallsTest, CountsEveryRefusalAndLogsAtMostOneLinePerInterval) {
  CountingObserver observer;
  common::FakeClock clock;
  RefusedCalls refused(3, &observer, &clock, absl::Seconds(10));
  const absl::Status bad_token =
      absl::UnauthenticatedError("the bearer token is not valid for job \"a\"");

  const std::optional<std::string> first =
      refused.Note(bad_token, "ipv4:10.0.0.7:41234");
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(
      *first,
      "shard 3: refused a call from ipv4:10.0.0.7:41234: UNAUTHENTICATED: "
      "the bearer token is not valid for job \"a\"");
  clock.Advance(absl::Seconds(5));
  EXPECT_FALSE(refused.Note(bad_token, "ipv4:10.0.0.7:41236").has_value());
  EXPECT_FALSE(refused
                   .Note(absl::PermissionDeniedError("token is for job a"),
                         "ipv4:10.0.0.8:5000")
                   .has_value());
  clock.Advance(absl::Seconds(5));
  const std::optional<std::string> next =
      refused.Note(bad_token, "ipv4:10.0.0.9:1");
  ASSERT_TRUE(next.has_value());
  EXPECT_NE(next->find("from ipv4:10.0.0.9:1"), std::string::npos) << *next;
  EXPECT_NE(next->find("(and 2 more refused calls since the last such line)"),
            std::string::npos)
      << *next;
  EXPECT_EQ(observer.codes, (std::vector<absl::StatusCode>{
                                absl::StatusCode::kUnauthenticated,
                                absl::StatusCode::kUnauthenticated,
                                absl::StatusCode::kPermissionDenied,
                                absl::StatusCode::kUnauthenticated}));
}

TEST(RefusedCallsTest, CheckPassesOtherStatusesThroughUncounted) {
  CountingObserver observer;
  common::FakeClock clock;
  RefusedCalls refused(0, &observer, &clock);
  CO2_EXPECT_OK(refused.Check(absl::OkStatus(), "peer"));
  EXPECT_EQ(refused.Check(absl::NotFoundError("unknown job"), "peer").code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(observer.codes.empty());
  EXPECT_EQ(refused.Check(absl::UnauthenticatedError("no token"), "peer").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(observer.codes.size(), 1u);
}

}  // namespace
}  // namespace co2::server
