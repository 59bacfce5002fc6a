// Command-line help for the binaries: `--help` lists the flags the binary's
// own main.cc defines, each with its help text and default, after the usage
// message (absl's default lists only flags of a file named after the
// program, which none of ours is, and prints "No flags matched."). Call
// before absl::ParseCommandLine, from main, once.
#ifndef CO2_COMMON_FLAGS_HELP_H_
#define CO2_COMMON_FLAGS_HELP_H_

#include "absl/strings/string_view.h"

namespace co2::common {

// `main_file`: __FILE__ of the main.cc that defines the flags; `usage`: the
// usage message that heads the help. `--help` (or `-h`) prints to stdout and
// exits 0.
void SetUpFlagsHelp(absl::string_view main_file, absl::string_view usage,
                    int argc, char** argv);

}  // namespace co2::common

#endif  // CO2_COMMON_FLAGS_HELP_H_
