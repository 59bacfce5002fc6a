#include "client/training/char_corpus.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2::client {
namespace {

using ::co2::testing::TempDir;

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Loading the installed corpus (~2.5 MB) once for the suite.
const CharCorpus* Installed() {
  static const CharCorpus* corpus = [] {
    auto loaded = CharCorpus::Load(CharCorpusOptions{});
    CO2_EXPECT_OK(loaded);
    return loaded.ok() ? new CharCorpus(*std::move(loaded)) : nullptr;
  }();
  return corpus;
}

// Fortunes of a text built by CharCorpus: each fortune followed by "%\n".
void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary) << contents;
}

std::vector<std::string> FortunesOf(const std::string& text) {
  return CharCorpus::SplitFortunes(text);
}

TEST(CharCorpusTest, SplitFortunes) {
  EXPECT_THAT(CharCorpus::SplitFortunes("a\nb\n%\nc\n%\n\n%\nlast"),
              ElementsAre("a\nb\n", "c\n", "last\n"));
  // "%" inside a line is text, not a separator.
  EXPECT_THAT(CharCorpus::SplitFortunes("100% sure\n%\n"),
              ElementsAre("100% sure\n"));
  EXPECT_TRUE(CharCorpus::SplitFortunes("").empty());
}

TEST(CharCorpusTest, InstalledCorpusIsLargeAndSplitAboutOneInTen) {
  ASSERT_NE(Installed(), nullptr);
  const CharCorpus& corpus = *Installed();
  const CharCorpusStats& stats = corpus.stats();
  EXPECT_GE(stats.files, 10);
  EXPECT_GT(corpus.train_text().size(), 1000000u);
  EXPECT_GT(corpus.heldout_text().size(), 100000u);
  const int64_t total = stats.train_fortunes + stats.heldout_fortunes;
  EXPECT_GT(total, 10000);
  // Every 10th unique fortune is held out.
  EXPECT_EQ(stats.heldout_fortunes, total / 10);
  EXPECT_EQ(static_cast<int64_t>(FortunesOf(corpus.train_text()).size()),
            stats.train_fortunes);
  EXPECT_EQ(static_cast<int64_t>(FortunesOf(corpus.heldout_text()).size()),
            stats.heldout_fortunes);
}

TEST(CharCorpusTest, TrainAndHeldOutShareNoFortune) {
  ASSERT_NE(Installed(), nullptr);
  const CharCorpus& corpus = *Installed();
  const std::vector<std::string> train = FortunesOf(corpus.train_text());
  const std::set<std::string> train_set(train.begin(), train.end());
  EXPECT_EQ(train_set.size(), train.size());  // duplicates were dropped
  for (const std::string& fortune : FortunesOf(corpus.heldout_text())) {
    ASSERT_EQ(train_set.count(fortune), 0u) << fortune;
  }
}

TEST(CharCorpusTest, LoadingIsDeterministic) {
  ASSERT_NE(Installed(), nullptr);
  auto again = CharCorpus::Load(CharCorpusOptions{});
  CO2_ASSERT_OK(again);
  EXPECT_EQ(again->train_text(), Installed()->train_text());
  EXPECT_EQ(again->heldout_text(), Installed()->heldout_text());
}

TEST(CharCorpusTest, SkipsIndexesAndDeduplicates) {
  TempDir dir("char_corpus_small");
  WriteFile(dir.Path("a"), "one\n%\ntwo\n%\nthree\n%\n");
  WriteFile(dir.Path("b"), "two\n%\nfour\n%\n");  // "two" repeats file a
  WriteFile(dir.Path("a.dat"), "\x02\x00binary index");
  WriteFile(dir.Path("a.u8"), "not read\n%\n");
  CharCorpusOptions options;
  options.directory = dir.path();
  options.heldout_every = 2;
  auto corpus = CharCorpus::Load(options);
  CO2_ASSERT_OK(corpus);
  EXPECT_EQ(corpus->stats().files, 2);
  EXPECT_EQ(corpus->stats().duplicates_dropped, 1);
  // Unique fortunes in order: one two three four; odd positions held out.
  EXPECT_EQ(corpus->train_text(), "one\n%\nthree\n%\n");
  EXPECT_EQ(corpus->heldout_text(), "two\n%\nfour\n%\n");
}

TEST(CharCorpusTest, MissingDirectory) {
  CharCorpusOptions options;
  options.directory = "/nonexistent/fortunes";
  auto corpus = CharCorpus::Load(options);
  EXPECT_EQ(corpus.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(corpus.status().message(), HasSubstr("/nonexistent/fortunes"));
}

TEST(CharCorpusTest, EmptyDirectory) {
  TempDir dir("char_corpus_empty");
  WriteFile(dir.Path("only.dat"), "index");
  WriteFile(dir.Path("blank"), "\n%\n  \n%\n");
  CharCorpusOptions options;
  options.directory = dir.path();
  auto corpus = CharCorpus::Load(options);
  EXPECT_EQ(corpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(corpus.status().message(), HasSubstr(dir.path()));
}

TEST(CharCorpusTest, NotADirectoryAndBadOptions) {
  TempDir dir("char_corpus_file");
  WriteFile(dir.Path("f"), "x\n%\n");
  CharCorpusOptions options;
  options.directory = dir.path() + "/f";
  EXPECT_EQ(CharCorpus::Load(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.directory = dir.path();
  options.heldout_every = 1;
  EXPECT_EQ(CharCorpus::Load(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WindowSamplerTest, WorkersSampleOnlyTheirOwnPart) {
  ASSERT_NE(Installed(), nullptr);
  const std::string& text = Installed()->train_text();
  constexpr int kWorkers = 3;
  int64_t covered = 0;
  for (int w = 0; w < kWorkers; ++w) {
    WindowSamplerOptions options;
    options.seq_len = 32;
    options.worker = w;
    options.num_workers = kWorkers;
    options.seed = 9;
    auto sampler = WindowSampler::Create(text, options);
    CO2_ASSERT_OK(sampler);
    const IndexRange part = sampler->part();
    EXPECT_EQ(part.begin, covered);  // parts tile the text in order
    covered = part.end;
    std::vector<uint8_t> windows;
    sampler->Sample(200, &windows);
    ASSERT_EQ(windows.size(), 200u * 33);
    const std::string own = text.substr(part.begin, part.size());
    for (int b = 0; b < 200; ++b) {
      const std::string window(windows.begin() + b * 33,
                               windows.begin() + (b + 1) * 33);
      ASSERT_NE(own.find(window), std::string::npos)
          << "worker " << w << " window " << b << " not in its part";
    }
  }
  EXPECT_EQ(covered, static_cast<int64_t>(text.size()));
}

TEST(WindowSamplerTest, WindowsHitPartEdgesExactly) {
  // A part of exactly one window: the only start is its beginning.
  const std::string text = "abcdefgh";  // 2 workers x 4 bytes
  WindowSamplerOptions options;
  options.seq_len = 3;
  options.worker = 1;
  options.num_workers = 2;
  auto sampler = WindowSampler::Create(text, options);
  CO2_ASSERT_OK(sampler);
  std::vector<uint8_t> windows;
  sampler->Sample(3, &windows);
  EXPECT_EQ(std::string(windows.begin(), windows.end()), "efghefghefgh");
}

TEST(WindowSamplerTest, SeededAndWorkerDependent) {
  ASSERT_NE(Installed(), nullptr);
  const std::string& text = Installed()->train_text();
  WindowSamplerOptions options;
  options.seq_len = 16;
  options.num_workers = 1;
  options.seed = 5;
  auto a = WindowSampler::Create(text, options);
  auto b = WindowSampler::Create(text, options);
  options.seed = 6;
  auto c = WindowSampler::Create(text, options);
  CO2_ASSERT_OK(a);
  CO2_ASSERT_OK(b);
  CO2_ASSERT_OK(c);
  std::vector<uint8_t> wa, wb, wc;
  a->Sample(8, &wa);
  b->Sample(8, &wb);
  c->Sample(8, &wc);
  EXPECT_EQ(wa, wb);
  EXPECT_NE(wa, wc);
  // The next batch differs from the first: the generator advances.
  a->Sample(8, &wb);
  EXPECT_NE(wa, wb);
}

TEST(WindowSamplerTest, RejectsPartsShorterThanAWindow) {
  WindowSamplerOptions options;
  options.seq_len = 4;
  options.num_workers = 2;
  auto sampler = WindowSampler::Create("abcdefgh", options);  // 4 < 5
  EXPECT_EQ(sampler.status().code(), absl::StatusCode::kFailedPrecondition);
  options.seq_len = 0;
  EXPECT_EQ(WindowSampler::Create("abcdefgh", options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.seq_len = 2;
  options.worker = 2;
  EXPECT_EQ(WindowSampler::Create("abcdefgh", options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace co2::client
