#include "server/service/job_tokens.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"

namespace co2::server {

absl::StatusOr<JobTokens> ParseJobTokens(absl::string_view text,
                                         const std::string& source) {
  JobTokens tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": expected `job token`, got ",
                       fields.size(), " fields"));
    }
    const std::string job(fields[0]);
    const std::string token(fields[1]);
    if (job == "*") {
      if (!tokens.any_job.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ":", line_number, ": a second `*` (any job) token"));
      }
      tokens.any_job = token;
      continue;
    }
    if (!tokens.per_job.emplace(job, token).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", line_number, ": job \"", job, "\" has a token already"));
    }
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " holds no `job token` line"));
  }
  return tokens;
}

absl::StatusOr<JobTokens> LoadJobTokensFile(const std::string& path) {
  std::string text;
  {
    // ReadPemFile's checks are for PEM; read plainly here.
    std::FILE* file = std::fopen(path.c_str(), "rb");
    if (file == nullptr) {
      return absl::NotFoundError(absl::StrCat("cannot read tokens file \"",
                                              path, "\": ", std::strerror(errno)));
    }
    char buffer[4096];
    size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
      text.append(buffer, n);
    }
    std::fclose(file);
  }
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    CO2_LOG(WARNING) << "tokens file " << path
                     << " is readable by group/others; chmod 600 it";
  }
  return ParseJobTokens(text, path);
}

}  // namespace co2::server
