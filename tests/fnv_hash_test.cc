#include "common/fnv_hash.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace co2::common {
namespace {

TEST(Fnv1aTest, MatchesTheReferenceValues) {
  EXPECT_EQ(Fnv1a({}), kFnv1aOffset);
  // 0.0f is four zero bytes; FNV-1a of "\0\0\0\0" (reference implementation).
  const std::vector<float> zero = {0.0f};
  EXPECT_EQ(Fnv1a(zero), 0x315446a086a23133ull);
}

TEST(Fnv1aTest, ChainingOverPiecesHashesTheWhole) {
  std::vector<float> whole(1000);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = 0.5f * i - 7.0f;
  const absl::Span<const float> all(whole);
  EXPECT_EQ(Fnv1a(all.subspan(300), Fnv1a(all.first(300))), Fnv1a(all));
  std::vector<float> other = whole;
  other[999] = -other[999];
  EXPECT_NE(Fnv1a(other), Fnv1a(all));
}

// The digest as aggregator.proto spells it (computed independently, in
// Python, for 0.5, 1.5, ..., 10.5: five words and a padded sixth).
TEST(AnchorDigestTest, MatchesTheProtoDefinition) {
  std::vector<float> values;
  for (int i = 0; i < 11; ++i) values.push_back(i + 0.5f);
  EXPECT_EQ(AnchorDigest(values), 0xe1dcda91ccd7449eull);
}

TEST(AnchorDigestTest, AnyOneChangedBitChangesIt) {
  std::vector<float> values(1001, 0.25f);
  const uint64_t digest = AnchorDigest(values);
  for (size_t i : {size_t{0}, size_t{7}, size_t{500}, size_t{1000}}) {
    std::vector<float> changed = values;
    changed[i] = std::nextafter(changed[i], 1.0f);
    EXPECT_NE(AnchorDigest(changed), digest) << "element " << i;
  }
  EXPECT_NE(AnchorDigest(absl::MakeConstSpan(values).subspan(0, 1000)), digest);
}

}  // namespace
}  // namespace co2::common
