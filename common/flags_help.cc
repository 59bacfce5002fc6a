#include "common/flags_help.h"

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "absl/flags/internal/program_name.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/strip.h"

namespace co2::common {

void SetUpFlagsHelp(absl::string_view main_file, absl::string_view usage,
                    int argc, char** argv) {
  // absl names a flag's file without the leading '/' of an absolute path
  // (a build without ccache's base directory compiles with those).
  absl::string_view path = main_file;
  while (absl::ConsumePrefix(&path, "/")) {
  }
  const std::string file(path);
  // Help begins "<program>: <usage>"; absl learns the program's name only
  // in ParseCommandLine, after this.
  if (argc > 0) absl::flags_internal::SetProgramInvocationName(argv[0]);
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [file](absl::string_view f) {
    return f == file;
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (std::strcmp(argv[i], "--help") == 0 ||
        std::strcmp(argv[i], "-help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      // absl's own --help exits with status 1; asking for help is no error.
      absl::flags_internal::FlagsHelp(
          std::cout, file, absl::flags_internal::HelpFormat::kHumanReadable,
          usage);
      std::cout.flush();
      std::exit(0);
    }
  }
}

}  // namespace co2::common
