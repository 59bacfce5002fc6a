#include "client/training/char_corpus.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace co2::client {
namespace {

namespace fs = std::filesystem;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  errno = 0;
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return absl::ErrnoToStatus(errno, path);
  std::string contents;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) {
    contents.append(buffer, n);
  }
  if (std::ferror(file.get())) return absl::ErrnoToStatus(errno, path);
  return contents;
}

// Fortune files in name order, so every worker builds the same corpus.
absl::StatusOr<std::vector<std::string>> ListFortuneFiles(
    const std::string& directory) {
  std::error_code ec;
  const fs::file_status status = fs::status(directory, ec);
  if (!fs::exists(status)) {
    return absl::NotFoundError(
        absl::StrCat("fortune directory ", directory, " does not exist"));
  }
  if (!fs::is_directory(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat(directory, " is not a directory"));
  }
  std::vector<std::string> files;
  fs::directory_iterator it(directory, ec);
  if (ec) {
    return absl::ErrnoToStatus(ec.value(),
                               absl::StrCat("cannot list ", directory));
  }
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    // .dat are strfile's binary indexes; .u8 are symlinks to the text files
    // themselves (reading them would count every fortune twice).
    if (absl::EndsWith(name, ".dat") || absl::EndsWith(name, ".u8") ||
        absl::StartsWith(name, ".")) {
      continue;
    }
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;  // "off/" and the like
    files.push_back(it->path().string());
  }
  if (ec) {
    return absl::ErrnoToStatus(ec.value(),
                               absl::StrCat("cannot list ", directory));
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::vector<std::string> CharCorpus::SplitFortunes(absl::string_view contents) {
  std::vector<std::string> fortunes;
  std::string current;
  auto flush = [&] {
    if (!absl::StripAsciiWhitespace(current).empty()) {
      fortunes.push_back(std::move(current));
    }
    current.clear();
  };
  size_t pos = 0;
  while (pos < contents.size()) {
    size_t end = contents.find('\n', pos);
    if (end == absl::string_view::npos) end = contents.size();
    const absl::string_view line = contents.substr(pos, end - pos);
    if (line == "%") {
      flush();
    } else {
      current.append(line.data(), line.size());
      current.push_back('\n');
    }
    pos = end + 1;
  }
  flush();  // the last fortune of a file may lack its closing "%"
  return fortunes;
}

absl::StatusOr<CharCorpus> CharCorpus::Load(const CharCorpusOptions& options) {
  if (options.heldout_every < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heldout_every must be >= 2, got ", options.heldout_every));
  }
  CO2_ASSIGN_OR_RETURN(std::vector<std::string> files,
                       ListFortuneFiles(options.directory));
  CharCorpus corpus;
  std::unordered_set<std::string> seen;
  int64_t index = 0;  // over unique fortunes, across files
  for (const std::string& path : files) {
    CO2_ASSIGN_OR_RETURN(std::string contents, ReadFile(path));
    ++corpus.stats_.files;
    for (std::string& fortune : SplitFortunes(contents)) {
      // A fortune repeated in two files must not sit on both sides of the
      // split, or the held-out loss would reward memorisation.
      if (!seen.insert(fortune).second) {
        ++corpus.stats_.duplicates_dropped;
        continue;
      }
      const bool heldout =
          index % options.heldout_every == options.heldout_every - 1;
      ++index;
      std::string& text = heldout ? corpus.heldout_text_ : corpus.train_text_;
      text += fortune;
      text += "%\n";
      ++(heldout ? corpus.stats_.heldout_fortunes
                 : corpus.stats_.train_fortunes);
    }
  }
  if (index == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no fortunes in ", options.directory, " (",
                     corpus.stats_.files, " files read)"));
  }
  if (corpus.stats_.heldout_fortunes == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "only ", index, " fortunes in ", options.directory,
        ", too few to hold out every ", options.heldout_every, "th"));
  }
  return corpus;
}

WindowSampler::WindowSampler(absl::string_view text, IndexRange part,
                             int64_t seq_len, uint64_t seed)
    : text_(text), part_(part), seq_len_(seq_len), rng_(seed) {}

absl::StatusOr<WindowSampler> WindowSampler::Create(
    absl::string_view text, const WindowSamplerOptions& options) {
  if (options.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len must be >= 1, got ", options.seq_len));
  }
  CO2_ASSIGN_OR_RETURN(IndexRange part,
                       ContiguousPart(static_cast<int64_t>(text.size()),
                                      options.worker, options.num_workers));
  if (part.size() < options.seq_len + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", options.worker, " of ", options.num_workers, " gets ",
        part.size(), " bytes of text, fewer than one window of ",
        options.seq_len + 1));
  }
  return WindowSampler(
      text, part, options.seq_len,
      MixSeed(options.seed, static_cast<uint64_t>(options.worker)));
}

void WindowSampler::Sample(int64_t batch_size, std::vector<uint8_t>* windows) {
  const int64_t window = seq_len_ + 1;
  const uint64_t num_starts = static_cast<uint64_t>(part_.size() - window + 1);
  windows->resize(
      static_cast<size_t>(std::max<int64_t>(batch_size, 0) * window));
  uint8_t* out = windows->data();
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t start =
        part_.begin + static_cast<int64_t>(UniformBelow(rng_, num_starts));
    std::copy_n(reinterpret_cast<const uint8_t*>(text_.data()) + start, window,
                out + b * window);
  }
}

}  // namespace co2::client
