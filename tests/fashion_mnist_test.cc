#include "client/training/fashion_mnist.h"

#include <zlib.h>

#include <array>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/training/data_shard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/temp_dir.h"

namespace co2::client {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const FashionMnistOptions kInstalled;  // the Debian package's directory

// The whole decompressed content of a gzip file (test-side reader, so the
// corrupted copies do not depend on the code under test).
std::string ReadGz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  std::string out;
  if (f == nullptr) return out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  gzclose(f);
  return out;
}

void WriteGz(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb1");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, data.data(), static_cast<unsigned>(data.size())),
            static_cast<int>(data.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

void PutBigEndian32(std::string* data, size_t offset, uint32_t value) {
  (*data)[offset] = static_cast<char>(value >> 24);
  (*data)[offset + 1] = static_cast<char>(value >> 16);
  (*data)[offset + 2] = static_cast<char>(value >> 8);
  (*data)[offset + 3] = static_cast<char>(value);
}

TEST(FashionMnistTest, LoadsTheInstalledData) {
  auto data = LoadFashionMnist(kInstalled);
  CO2_ASSERT_OK(data);
  ASSERT_EQ(data->train.size(), 60000);
  ASSERT_EQ(data->test.size(), 10000);
  EXPECT_EQ(data->train.images.size(), 60000u * kFashionMnistPixels);
  EXPECT_EQ(data->test.images.size(), 10000u * kFashionMnistPixels);

  std::array<int, kFashionMnistClasses> train_hist{}, test_hist{};
  for (uint8_t label : data->train.labels) ++train_hist[label];
  for (uint8_t label : data->test.labels) ++test_hist[label];
  for (int c = 0; c < kFashionMnistClasses; ++c) {
    EXPECT_EQ(train_hist[c], 6000) << "class " << c;
    EXPECT_EQ(test_hist[c], 1000) << "class " << c;
  }
  // The published order: the first training example is an ankle boot (9).
  EXPECT_THAT(std::vector<uint8_t>(data->train.labels.begin(),
                                   data->train.labels.begin() + 10),
              ElementsAre(9, 0, 0, 3, 0, 2, 7, 2, 5, 5));
  // Pixels really are images: mostly background, some full ink.
  double sum = 0;
  int saturated = 0;
  for (uint8_t p : data->train.images) {
    sum += p;
    saturated += p == 255;
  }
  EXPECT_NEAR(sum / data->train.images.size() / 255.0, 0.2860, 1e-3);
  EXPECT_GT(saturated, 0);
}

TEST(FashionMnistTest, ShardsOfTheTrainingSetAreDisjointCompleteAndMixed) {
  auto data = LoadFashionMnistSplit(kInstalled, FashionMnistSplit::kTrain);
  CO2_ASSERT_OK(data);
  constexpr int kWorkers = 4;
  std::vector<int> owner(data->size(), -1);
  for (int w = 0; w < kWorkers; ++w) {
    auto shard = ShardIndices(data->size(), w, kWorkers, /*seed=*/17);
    CO2_ASSERT_OK(shard);
    EXPECT_EQ(shard->size(), 15000u);
    std::array<int, kFashionMnistClasses> hist{};
    for (int64_t i : *shard) {
      ASSERT_EQ(owner[i], -1) << "example " << i << " in two shards";
      owner[i] = w;
      ++hist[data->labels[i]];
    }
    // A shuffled shard holds every class in about its share (1500); the
    // binomial standard deviation is ~37.
    for (int c = 0; c < kFashionMnistClasses; ++c) {
      EXPECT_NEAR(hist[c], 1500, 200) << "worker " << w << " class " << c;
    }
  }
  for (size_t i = 0; i < owner.size(); ++i) {
    ASSERT_NE(owner[i], -1) << "example " << i << " in no shard";
  }
}

TEST(FashionMnistTest, FileNames) {
  const FashionMnistFiles test =
      FashionMnistFileNames(FashionMnistSplit::kTest);
  EXPECT_EQ(test.images, "t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(test.labels, "t10k-labels-idx1-ubyte.gz");
}

// Each case writes a copy of the real test split, damaged in one way, into
// its own temporary directory and loads it.
class CorruptFashionMnistTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const FashionMnistFiles names =
        FashionMnistFileNames(FashionMnistSplit::kTest);
    images_ =
        new std::string(ReadGz(kInstalled.directory + "/" + names.images));
    labels_ =
        new std::string(ReadGz(kInstalled.directory + "/" + names.labels));
  }
  static void TearDownTestSuite() {
    delete images_;
    delete labels_;
  }

  void SetUp() override {
    images_path_ = dir_.Path("t10k-images-idx3-ubyte.gz");
    labels_path_ = dir_.Path("t10k-labels-idx1-ubyte.gz");
  }

  absl::StatusOr<FashionMnistExamples> Load(const std::string& images,
                                            const std::string& labels) {
    WriteGz(images_path_, images);
    WriteGz(labels_path_, labels);
    FashionMnistOptions options;
    options.directory = dir_.path();
    return LoadFashionMnistSplit(options, FashionMnistSplit::kTest);
  }

  static std::string* images_;
  static std::string* labels_;
  const co2::testing::TempDir dir_{"fmnist"};
  std::string images_path_;
  std::string labels_path_;
};

std::string* CorruptFashionMnistTest::images_ = nullptr;
std::string* CorruptFashionMnistTest::labels_ = nullptr;

TEST_F(CorruptFashionMnistTest, IntactCopyLoads) {
  auto examples = Load(*images_, *labels_);
  CO2_ASSERT_OK(examples);
  EXPECT_EQ(examples->size(), 10000);
}

TEST_F(CorruptFashionMnistTest, BadImageMagic) {
  std::string images = *images_;
  PutBigEndian32(&images, 0, 0);
  auto examples = Load(images, *labels_);
  EXPECT_EQ(examples.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(examples.status().message(),
              HasSubstr("t10k-images-idx3-ubyte.gz: bad magic 0x00000000, "
                        "expected 0x00000803"));
}

TEST_F(CorruptFashionMnistTest, BadLabelMagic) {
  std::string labels = *labels_;
  PutBigEndian32(&labels, 0, kIdxImagesMagic);
  auto examples = Load(*images_, labels);
  EXPECT_EQ(examples.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(examples.status().message(),
              HasSubstr("t10k-labels-idx1-ubyte.gz: bad magic 0x00000803, "
                        "expected 0x00000801"));
}

TEST_F(CorruptFashionMnistTest, TruncatedImages) {
  // A valid gzip stream whose payload stops half-way through an image.
  const std::string images = images_->substr(0, images_->size() - 400);
  auto examples = Load(images, *labels_);
  EXPECT_EQ(examples.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(examples.status().message(),
              AllOf(HasSubstr(images_path_), HasSubstr("truncated")));
}

TEST_F(CorruptFashionMnistTest, TruncatedGzipStream) {
  ASSERT_NO_FATAL_FAILURE(WriteGz(labels_path_, *labels_));
  ASSERT_NO_FATAL_FAILURE(WriteGz(images_path_, *images_));
  // Cut the compressed file itself in half.
  fs::resize_file(images_path_, fs::file_size(images_path_) / 2);
  FashionMnistOptions options;
  options.directory = dir_.path();
  auto examples = LoadFashionMnistSplit(options, FashionMnistSplit::kTest);
  EXPECT_EQ(examples.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(examples.status().message(), HasSubstr(images_path_));
}

TEST_F(CorruptFashionMnistTest, TrailingBytes) {
  auto examples = Load(*images_, *labels_ + "xx");
  EXPECT_EQ(examples.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(examples.status().message(),
              AllOf(HasSubstr(labels_path_), HasSubstr("trailing")));
}

TEST_F(CorruptFashionMnistTest, CountMismatchBetweenImagesAndLabels) {
  // A consistent label file of 9999 labels next to 10000 images.
  std::string labels = labels_->substr(0, labels_->size() - 1);
  PutBigEndian32(&labels, 4, 9999);
  auto examples = Load(*images_, labels);
  EXPECT_EQ(examples.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(examples.status().message(),
              AllOf(HasSubstr(labels_path_), HasSubstr(images_path_),
                    HasSubstr("9999 labels"), HasSubstr("10000 images")));
}

TEST_F(CorruptFashionMnistTest, HeaderCountDisagreesWithLength) {
  std::string images = *images_;
  PutBigEndian32(&images, 4, 10001);
  auto examples = Load(images, *labels_);
  EXPECT_EQ(examples.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(examples.status().message(), HasSubstr(images_path_));
}

TEST_F(CorruptFashionMnistTest, LabelOutOfRange) {
  std::string labels = *labels_;
  labels[8 + 1234] = 11;
  auto examples = Load(*images_, labels);
  EXPECT_EQ(examples.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(examples.status().message(),
              AllOf(HasSubstr(labels_path_), HasSubstr("label 11"),
                    HasSubstr("index 1234")));
}

TEST_F(CorruptFashionMnistTest, WrongGeometry) {
  std::string images = *images_;
  PutBigEndian32(&images, 12, 27);
  auto examples = Load(images, *labels_);
  EXPECT_EQ(examples.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(examples.status().message(),
              AllOf(HasSubstr(images_path_), HasSubstr("28x27")));
}

TEST_F(CorruptFashionMnistTest, EmptyFile) {
  auto examples = Load("", *labels_);
  EXPECT_EQ(examples.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(examples.status().message(), HasSubstr(images_path_));
}

TEST_F(CorruptFashionMnistTest, MissingFile) {
  ASSERT_NO_FATAL_FAILURE(WriteGz(images_path_, *images_));
  FashionMnistOptions options;
  options.directory = dir_.path();
  auto examples = LoadFashionMnistSplit(options, FashionMnistSplit::kTest);
  EXPECT_EQ(examples.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(examples.status().message(), HasSubstr(labels_path_));
}

TEST(FashionMnistTest, MissingDirectory) {
  FashionMnistOptions options;
  options.directory = "/nonexistent/fashion-mnist";
  auto data = LoadFashionMnist(options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(
      data.status().message(),
      HasSubstr("/nonexistent/fashion-mnist/train-images-idx3-ubyte.gz"));
}

}  // namespace
}  // namespace co2::client
