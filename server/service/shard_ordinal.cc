#include "server/service/shard_ordinal.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace co2::server {

absl::StatusOr<int> OrdinalFromHostname(absl::string_view hostname) {
  absl::string_view name = hostname.substr(0, hostname.find('.'));
  const size_t dash = name.rfind('-');
  absl::string_view digits = dash == absl::string_view::npos
                                 ? absl::string_view()
                                 : name.substr(dash + 1);
  bool all_digits = !digits.empty() && digits.size() <= 9;
  for (char c : digits) all_digits = all_digits && absl::ascii_isdigit(c);
  int ordinal = 0;
  if (!all_digits || !absl::SimpleAtoi(digits, &ordinal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hostname \"", hostname,
                     "\" does not end in -N (a StatefulSet pod ordinal); give "
                     "--shard_index instead"));
  }
  return ordinal;
}

absl::StatusOr<int> ResolveShardIndex(int flag_value, bool from_hostname) {
  if (!from_hostname) return flag_value;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) {
    return absl::InternalError(
        absl::StrCat("gethostname: ", std::strerror(errno)));
  }
  return OrdinalFromHostname(name);
}

}  // namespace co2::server
