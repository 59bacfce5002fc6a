// ChunkScreen: the outlier rule of one chunk of one round
// (JobConfig.outlier_ratio = k; docs/algorithm.md, "Robust rounds"). With at
// least 3 contributions, one whose norm w·||Δ_c|| (weighted as the mean
// weighs it) is more than k × the median of the chunk's norms is held out of
// the mean.
//
// The round's sums are streamed, so a contribution is judged twice. At
// arrival (ShouldHold) against an estimate of the median: the chunk's median
// of the last round, or, without one, the median of this round's norms so
// far; one within k × the estimate is added to the sum at once, one above it
// (or with no estimate) is held: its payload is copied and waits. When the
// chunk's mean is taken (Settle) the median of all its norms is known: each
// held contribution within k × it is added then, the others are held out.
// So only suspicious contributions are copied, and a held-out one never
// touches the sum (nothing to subtract, fp32 or exact).
//
// Not thread-safe: RoundState's owner serialises calls.
#ifndef CO2_SERVER_JOB_CHUNK_SCREEN_H_
#define CO2_SERVER_JOB_CHUNK_SCREEN_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/codec.h"
#include "common/payload_pieces.h"

namespace co2::server {

// weight · ||decode(payload)||₂ over `elements` values; `payload` must have
// passed validation for them.
double WeightedNorm(common::Codec codec, common::Pieces payload,
                    size_t elements, double weight);

// The median of `values` (the mean of the middle two for an even count);
// `values` is reordered. 0 when empty.
double Median(std::vector<double>& values);

// A contribution held out of its chunk's mean.
struct HeldOut {
  std::string worker;
  uint32_t chunk_index = 0;
  double norm = 0;    // w·||Δ_c||
  double median = 0;  // of the chunk's norms
  // Why, for the worker and the log: the ratio to the median and k, or why
  // a held contribution within the rule could not be added.
  std::string reason;
  // Held out by the rule; false: within it, but its values did not fit the
  // sum when it was added (fp32 overflow, as ChunkSum::Add refuses).
  bool outlier = true;
};

// The contributions in chunk `chunk_index`'s mean: `complete` less those of
// `held_out` held out of that chunk.
uint32_t ChunkContributors(uint32_t complete,
                           const std::vector<HeldOut>& held_out,
                           uint32_t chunk_index);

class ChunkScreen {
 public:
  // Adds w·decode(payload) to the chunk's sum: INVALID_ARGUMENT when it
  // does not fit (ChunkSum::Add).
  using AddFn = absl::FunctionRef<absl::Status(common::Codec codec,
                                               common::Pieces payload,
                                               float weight)>;

  // Whether a contribution of `norm` arriving now waits for the chunk's
  // median rather than being added at once (k > 0); `last_median` is the
  // chunk's median in the last round, if known.
  bool ShouldHold(double norm, double k,
                  std::optional<double> last_median) const;
  // The contribution was added to the sum.
  void Added(double norm) { norms_.push_back(norm); }
  // The contribution waits: its payload is copied.
  void Hold(std::string_view worker, double norm, common::Codec codec,
            common::Pieces payload, float weight);

  struct Settled {
    std::optional<double> median;  // nullopt without contributions
    double max_ratio = 0;          // largest norm / median (0: none)
  };
  // The chunk's mean is about to be taken: adds each held contribution
  // within the rule with `add` and appends the others to `held_out`; then
  // empty again.
  Settled Settle(double k, uint32_t chunk_index, AddFn add,
                 std::vector<HeldOut>* held_out);

 private:
  struct Held {
    std::string worker;
    double norm = 0;
    common::Codec codec = common::Codec::kFp32;
    std::string payload;
    float weight = 0;
  };
  std::vector<double> norms_;  // of every contribution, added or held
  std::vector<Held> held_;
};

}  // namespace co2::server

#endif  // CO2_SERVER_JOB_CHUNK_SCREEN_H_
