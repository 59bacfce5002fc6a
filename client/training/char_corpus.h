// Character-level text corpus built from the `fortunes` package, and the
// sampler that hands worker w of W training windows from its own part of it.
//
// Tokens are bytes (vocabulary 256): every worker derives the same ids with
// no vocabulary to exchange, and the model's shape (hence the flat parameter
// layout the aggregator checks) does not depend on which characters happen
// to occur. CharCorpus is immutable after Load (any thread may read it);
// a WindowSampler belongs to one thread.
#ifndef CO2_CLIENT_TRAINING_CHAR_CORPUS_H_
#define CO2_CLIENT_TRAINING_CHAR_CORPUS_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/training/data_shard.h"

namespace co2::client {

inline constexpr int kCharVocabSize = 256;

struct CharCorpusOptions {
  // Directory of fortune files; files ending in .dat or .u8 (strfile
  // indexes) and subdirectories are skipped.
  std::string directory = "/usr/share/games/fortunes";
  // Fortune k (counted over all files in name order, after removing
  // duplicates) is held out when k % heldout_every == heldout_every - 1.
  // Interleaving, rather than the last files, keeps every topic in both
  // parts. Must be >= 2.
  int heldout_every = 10;
};

struct CharCorpusStats {
  int files = 0;  // fortune files read
  int64_t train_fortunes = 0;
  int64_t heldout_fortunes = 0;
  int64_t duplicates_dropped = 0;  // exact repeats across files
};

class CharCorpus {
 public:
  // Reads the corpus. NOT_FOUND when the directory does not exist,
  // INVALID_ARGUMENT when it is not a directory or heldout_every < 2,
  // FAILED_PRECONDITION when it holds no fortunes or too few to hold any
  // out, and the errno-derived code when a file cannot be read.
  static absl::StatusOr<CharCorpus> Load(const CharCorpusOptions& options);

  // Splits one fortune file into fortunes: the text between lines that are
  // exactly "%", each ending in '\n'. Blank fortunes are dropped.
  static std::vector<std::string> SplitFortunes(absl::string_view contents);

  // Training and held-out text: each fortune followed by "%\n", as in the
  // source files, so a model also learns where a fortune ends.
  const std::string& train_text() const { return train_text_; }
  const std::string& heldout_text() const { return heldout_text_; }
  const CharCorpusStats& stats() const { return stats_; }

 private:
  CharCorpus() = default;

  std::string train_text_;
  std::string heldout_text_;
  CharCorpusStats stats_;
};

struct WindowSamplerOptions {
  int64_t seq_len = 64;  // T: inputs per window; a window holds T+1 bytes
  int worker = 0;        // w in [0, num_workers)
  int num_workers = 1;   // W
  uint64_t seed = 0;     // job seed; mixed with the worker id
};

// Samples windows of T+1 consecutive bytes (inputs = first T, targets = last
// T) uniformly from worker w's contiguous part of the text: part w is
// ContiguousPart(text.size(), w, W), so workers never see each other's text.
class WindowSampler {
 public:
  // `text` is borrowed and must outlive the sampler. INVALID_ARGUMENT for
  // seq_len < 1 or a bad worker/num_workers, FAILED_PRECONDITION when the
  // worker's part is shorter than one window.
  static absl::StatusOr<WindowSampler> Create(
      absl::string_view text, const WindowSamplerOptions& options);

  // Replaces *windows with batch_size windows, row-major
  // [batch_size][seq_len + 1].
  void Sample(int64_t batch_size, std::vector<uint8_t>* windows);

  // This worker's byte range of the text.
  IndexRange part() const { return part_; }
  int64_t seq_len() const { return seq_len_; }

 private:
  WindowSampler(absl::string_view text, IndexRange part, int64_t seq_len,
                uint64_t seed);

  absl::string_view text_;
  IndexRange part_;
  int64_t seq_len_;
  std::mt19937_64 rng_;
};

}  // namespace co2::client

#endif  // CO2_CLIENT_TRAINING_CHAR_CORPUS_H_
