// TempDir: a fresh directory for one test, removed with everything in it
// when the TempDir goes out of scope. It lies under ::testing::TempDir()
// ($TEST_TMPDIR, else $TMPDIR, else /tmp), named <prefix>.XXXXXX by
// mkdtemp, so tests that run at once never share one. Not copyable or
// movable: the directory lives exactly as long as the object. Header only.
#ifndef CO2_TESTS_TEMP_DIR_H_
#define CO2_TESTS_TEMP_DIR_H_

#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "gtest/gtest.h"

namespace co2::testing {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "co2") {
    std::string base = ::testing::TempDir();
    if (base.empty() || base.back() != '/') base += '/';
    std::string pattern = base + std::string(prefix) + ".XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      // No test can go on without its directory; a constructor cannot
      // ASSERT, so say why and stop.
      std::fprintf(stderr, "mkdtemp(%s): %s\n", pattern.c_str(),
                   std::strerror(errno));
      std::abort();
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The directory, without a trailing '/'.
  const std::string& path() const { return path_; }
  // path()/name.
  std::string Path(std::string_view name) const {
    return path_ + "/" + std::string(name);
  }

 private:
  std::string path_;
};

}  // namespace co2::testing

#endif  // CO2_TESTS_TEMP_DIR_H_
