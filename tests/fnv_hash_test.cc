#include "common/fnv_hash.h"

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

}  // namespace
}  // namespace co2::common
