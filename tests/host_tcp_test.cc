#include "common/host_tcp.h"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2::common {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A directory laid out as /proc/sys/net/ipv4 with the four files.
class HostTcpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Write("tcp_wmem", "4096\t16384\t4194304");
    Write("tcp_rmem", "4096\t131072\t6291456");
    Write("tcp_slow_start_after_idle", "1");
    Write("tcp_congestion_control", "cubic");
  }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text << "\n";
  }

  const co2::testing::TempDir temp_dir_{"host_tcp"};
  const std::string dir_ = temp_dir_.path();
};

TEST_F(HostTcpTest, ReadsTheMaximaAndSwitches) {
  absl::StatusOr<HostTcpSettings> s = ReadHostTcpSettings(dir_);
  CO2_ASSERT_OK(s);
  EXPECT_EQ(s->send_buffer_max, 4194304);
  EXPECT_EQ(s->receive_buffer_max, 6291456);
  EXPECT_TRUE(s->slow_start_after_idle);
  EXPECT_EQ(s->congestion_control, "cubic");
}

TEST_F(HostTcpTest, NamesTheFileThatIsMissingOrMalformed) {
  Write("tcp_wmem", "4096 16384");
  absl::StatusOr<HostTcpSettings> s = ReadHostTcpSettings(dir_);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("tcp_wmem is '4096 16384'"));
  Write("tcp_wmem", "4096 16384 4194304");
  Write("tcp_slow_start_after_idle", "2");
  s = ReadHostTcpSettings(dir_);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("expected 0 or 1"));
  std::filesystem::remove(dir_ + "/tcp_rmem");
  s = ReadHostTcpSettings(dir_);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("tcp_rmem"));
}

TEST_F(HostTcpTest, OneStreamMovesTheSmallerBufferPerRoundTrip) {
  const HostTcpSettings s = *ReadHostTcpSettings(dir_);
  // 4 MiB per 100 ms: 335.5 Mbit/s.
  EXPECT_NEAR(StreamCapBitsPerSecond(s, absl::Milliseconds(100)),
              4194304.0 * 8 / 0.1, 1);
  EXPECT_TRUE(std::isinf(StreamCapBitsPerSecond(s, absl::ZeroDuration())));
}

TEST_F(HostTcpTest, DefaultsLimitALongGigabitPathAndSayWhatToSet) {
  const HostTcpSettings s = *ReadHostTcpSettings(dir_);
  const LinkPath path{1e9, absl::Milliseconds(100)};
  EXPECT_TRUE(LimitsPath(s, path));
  const std::string line = DescribeHostTcp(s, path);
  EXPECT_THAT(line, HasSubstr("at most 336 Mbit/s over the 100ms path"));
  EXPECT_THAT(line, HasSubstr("below its 1000 Mbit/s"));
  // Twice the path's 12.5 MB in flight.
  EXPECT_THAT(line, HasSubstr("maxima >= 23.8 MiB"));
  EXPECT_THAT(line, HasSubstr("tcp_slow_start_after_idle=0"));
}

TEST_F(HostTcpTest, TunedHostsDoNotLimitThePath) {
  Write("tcp_wmem", "4096 16384 67108864");
  Write("tcp_rmem", "4096 131072 67108864");
  Write("tcp_slow_start_after_idle", "0");
  const HostTcpSettings s = *ReadHostTcpSettings(dir_);
  const LinkPath path{1e9, absl::Milliseconds(100)};
  EXPECT_FALSE(LimitsPath(s, path));
  EXPECT_THAT(DescribeHostTcp(s, path), Not(HasSubstr("Set ")));
  // No path said: nothing is checked.
  EXPECT_FALSE(LimitsPath(*ReadHostTcpSettings(dir_), LinkPath{}));
}

TEST_F(HostTcpTest, CollectorExportsTheSettingsAndTheCap) {
  const HostTcpCollector collector({1e9, absl::Milliseconds(100)}, dir_);
  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& f : collector.Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string key = f.name;
      for (const auto& label : m.label) key += "/" + label.value;
      values[key] = m.gauge.value;
    }
  }
  EXPECT_EQ(values["co2_tcp_buffer_max_bytes/send"], 4194304);
  EXPECT_EQ(values["co2_tcp_buffer_max_bytes/receive"], 6291456);
  EXPECT_EQ(values["co2_tcp_slow_start_after_idle"], 1);
  EXPECT_EQ(values["co2_link_path_bits_per_second"], 1e9);
  EXPECT_DOUBLE_EQ(values["co2_link_path_rtt_seconds"], 0.1);
  EXPECT_NEAR(values["co2_tcp_stream_cap_bits_per_second"], 335544320, 1);
}

TEST(HostTcpCheckTest, RefusesANegativeOrNonFiniteRateOrRoundTrip) {
  absl::Status s = CheckLinkPathAndLogHostTcp({-1e6, absl::ZeroDuration()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--link_mbit is -1"));
  s = CheckLinkPathAndLogHostTcp({0, absl::Milliseconds(-5)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--link_rtt is -5ms"));
  s = CheckLinkPathAndLogHostTcp({std::nan(""), absl::ZeroDuration()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--link_mbit is nan"));
  s = CheckLinkPathAndLogHostTcp({HUGE_VAL, absl::ZeroDuration()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--link_mbit is inf"));
  s = CheckLinkPathAndLogHostTcp({1e9, absl::InfiniteDuration()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--link_rtt is inf"));
  CO2_EXPECT_OK(CheckLinkPathAndLogHostTcp({1e9, absl::Milliseconds(50)}));
}

}  // namespace
}  // namespace co2::common
