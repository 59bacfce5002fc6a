#include "server/job/round_state.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/layout.h"
#include "common/status_macros.h"

namespace co2::server {
namespace {

// Debian's Abseil is built with its own string_view, distinct from std's.
absl::string_view AsAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

}  // namespace

// How the state is kept:
//  - Two slots of sums alternate by round parity, so rounds open and
//    open + 1 never share one. A chunk's sum exists only from its round's
//    first chunk until that round closes: Close takes each chunk's mean
//    into the ClosedRound. A full chunk's sum object is then kept (spare_)
//    for the next chunk that needs one (an exact sum keeps its memory: what
//    the kernel hands out afresh is zeroed page by page, on every round,
//    which costs more than the sum itself; an fp32 sum hands its buffer
//    over as the mean).
//  - Accumulation uses the weight rounded to fp32, and the weight sums add
//    that same fp32 value (server/job/chunk_sum.h), so Σ w·Δ / Σ w is exact
//    for equal weights and integer deltas.
//  - A round never closes without a complete contribution, and a complete
//    contribution has a weight > 0 on every chunk, so no chunk has a
//    weight sum of 0 at close. The guard in Close (mean 0 for such a chunk)
//    is defensive only: it keeps a broken invariant from producing NaN.
//  - Contribution weight (ClosedRound::total_weight) is the weight a worker
//    sent with chunk 0 of the round; the mean itself uses every chunk's own
//    weight.
//  - Only chunks of the open round itself start its deadline; a folded
//    straggler's chunk of the previous round does not.
//  - With an empty shard (no chunks) nothing can arrive, so no round closes.

void RoundState::ChunkSet::Reset(uint32_t num_chunks) {
  words_.assign((num_chunks + 63) / 64, 0);
  count_ = 0;
}

void RoundState::ChunkSet::Clear() {
  std::fill(words_.begin(), words_.end(), 0);
  count_ = 0;
}

void RoundState::ChunkSet::Set(uint32_t c) {
  const uint64_t bit = uint64_t{1} << (c % 64);
  if ((words_[c / 64] & bit) == 0) {
    words_[c / 64] |= bit;
    ++count_;
  }
}

RoundState::RoundState(const RoundOptions& options, common::Clock* clock)
    : options_(options),
      clock_(clock),
      num_chunks_(
          static_cast<uint32_t>(common::NumChunks(options.shard_elements))),
      open_(options.first_round),
      deadline_rule_(options.deadline, options.round_timeout) {
  taken_.Reset(num_chunks_);
  senders_.assign(num_chunks_, 0);
  if (options_.outlier_ratio > 0) {
    for (auto& screens : screens_) screens.resize(num_chunks_);
    last_median_.resize(num_chunks_);
  }
}

RoundState::Worker& RoundState::RecordOf(std::string_view worker) {
  auto [it, inserted] = workers_.try_emplace(AsAbsl(worker));
  if (inserted) {
    for (ChunkSet& set : it->second.received) set.Reset(num_chunks_);
  }
  return it->second;
}

void RoundState::AddWorker(std::string_view worker, uint64_t first_round) {
  Worker& w = RecordOf(worker);
  if (!w.live) ++live_workers_;
  w.live = true;
  w.first_round = first_round;
  w.missed = false;
  RecountSenders();
}

void RoundState::RemoveWorker(std::string_view worker) {
  auto it = workers_.find(AsAbsl(worker));
  if (it == workers_.end() || !it->second.live) return;
  it->second.live = false;
  --live_workers_;
  RecountSenders();
  // The record stays while it has counted chunks (see workers_); Close drops
  // it once they leave the window.
}

bool RoundState::IsLive(std::string_view worker) const {
  auto it = workers_.find(AsAbsl(worker));
  return it != workers_.end() && it->second.live;
}

size_t RoundState::live_workers() const { return live_workers_; }

bool RoundState::HasWorkerWithoutRound() const {
  for (const auto& [id, w] : workers_) {
    if (w.live && w.first_round == UINT64_MAX) return true;
  }
  return false;
}

absl::StatusOr<ChunkOutcome> RoundState::AddChunk(
    std::string_view worker, uint64_t round, uint32_t chunk_index,
    common::Codec codec, std::string_view payload, double weight) {
  return AddChunk(worker, round, chunk_index, codec,
                  common::Pieces(&payload, 1), weight);
}

absl::StatusOr<ChunkOutcome> RoundState::AddChunk(
    std::string_view worker, uint64_t round, uint32_t chunk_index,
    common::Codec codec, common::Pieces payload, double weight) {
  // Malformed requests first: they are never worth a retry.
  if (chunk_index >= num_chunks_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_index ", chunk_index,
                                                   " out of range: shard has ",
                                                   num_chunks_, " chunks"));
  }
  if (!(std::isfinite(weight) && weight > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight must be finite and > 0, got ", weight));
  }
  CO2_RETURN_IF_ERROR(ChunkSum::CheckWeight(weight));
  const absl::StatusOr<common::Codec> known =
      common::CodecFromWire(static_cast<int>(codec));
  if (!known.ok()) return known.status();
  const size_t elements = ChunkElements(chunk_index);
  const size_t expected = common::EncodedSize(codec, elements);
  if (common::TotalSize(payload) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload of chunk ", chunk_index, " is ",
                     common::TotalSize(payload),
                     " bytes, expected ", expected, " for ", elements, " ",
                     AsAbsl(common::CodecName(codec)), " elements"));
  }

  auto it = workers_.find(AsAbsl(worker));
  if (it == workers_.end() || !it->second.live) {
    return absl::NotFoundError(absl::StrCat(
        "worker \"", AsAbsl(worker), "\" is not a live member of this job"));
  }
  const uint64_t lowest = open_ == 0 ? 0 : open_ - 1;
  if (round < lowest) {
    return absl::AbortedError(
        absl::StrCat("round ", round, " is stale: open round is ", open_,
                     " (accepted ", lowest, "..", open_ + 1, ")"));
  }
  if (round > open_ + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round, " is ahead of open round ", open_,
                     " (accepted ", lowest, "..", open_ + 1, ")"));
  }

  // round >= open − 1 here, so this is kPrev, kOpen or kNext.
  const int rel = static_cast<int>(round + 1 - open_);
  Worker& w = it->second;
  ChunkOutcome outcome;
  if (w.received[rel].Test(chunk_index)) {
    outcome.duplicate = true;
    return outcome;
  }
  // A straggler's chunk of open − 1 is folded into the open round, and a
  // chunk of the open round taken ahead into the next.
  uint64_t target = rel == kPrev ? open_ : round;
  if (target == open_ && taken_.Test(chunk_index)) ++target;
  outcome.folded = target != round;
  const absl::Status added =
      Accumulate(Slot(target), chunk_index, codec, payload,
                 static_cast<float>(weight), worker);
  if (!added.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker \"", AsAbsl(worker), "\" round ", round,
                     " chunk ", chunk_index, ": ", added.message()));
  }
  w.received[rel].Set(chunk_index);
  if (chunk_index == 0) w.weight0[rel] = weight;
  if (w.missed) {
    w.missed = false;  // back: required again, with what it has sent
    RecountSenders();
  } else if (rel == kOpen && Required(w) &&
             ++senders_[chunk_index] == required_) {
    ready_.push_back(chunk_index);
  }
  if (!outcome.folded) {
    has_chunk_[Slot(round)] = true;
    if (round == open_ && !deadline_.has_value()) ArmDeadline();
  }
  return outcome;
}

absl::Status RoundState::Accumulate(int slot, uint32_t chunk_index,
                                    common::Codec codec,
                                    common::Pieces payload, float w,
                                    std::string_view worker) {
  const common::Range range =
      common::ChunkRange(options_.shard_elements, chunk_index);
  double norm = 0;
  if (options_.outlier_ratio > 0) {
    ChunkScreen& screen = screens_[slot][chunk_index];
    norm = WeightedNorm(codec, payload, range.size(), w);
    if (screen.ShouldHold(norm, options_.outlier_ratio,
                          last_median_[chunk_index])) {
      screen.Hold(worker, norm, codec, payload, w);
      return absl::OkStatus();
    }
  }
  // All or nothing: a contribution that does not fit changes nothing.
  const absl::Status added =
      AccumulatorOf(slot, chunk_index).Add(codec, payload, w);
  if (!added.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(added.message(), " (chunk element 0 is shard element ",
                     range.begin, "); chunk rejected"));
  }
  if (options_.outlier_ratio > 0) screens_[slot][chunk_index].Added(norm);
  return absl::OkStatus();
}

ChunkSum& RoundState::AccumulatorOf(int slot, uint32_t chunk_index) {
  std::vector<std::unique_ptr<ChunkSum>>& chunks = acc_[slot];
  if (chunks.empty()) chunks.resize(num_chunks_);
  std::unique_ptr<ChunkSum>& acc = chunks[chunk_index];
  if (acc != nullptr) return *acc;
  const size_t elements = ChunkElements(chunk_index);
  if (!spare_.empty() && spare_.back()->size() == elements) {
    acc = std::move(spare_.back());
    spare_.pop_back();
  } else {
    acc = ChunkSum::Create(options_.exact_sums, elements);
  }
  return *acc;
}

std::optional<ClosedRound> RoundState::TryClose() {
  if (num_chunks_ == 0) return std::nullopt;
  uint32_t complete = 0;
  double total_weight = 0;
  bool all_required_done = true;
  bool any_missing = false;  // a live worker of this round not complete
  for (const auto& [id, w] : workers_) {
    if (w.received[kOpen].count() == num_chunks_) {
      ++complete;
      total_weight += w.weight0[kOpen];
    } else if (w.live && w.first_round <= open_) {
      any_missing = true;
      if (Required(w)) all_required_done = false;
    }
  }
  if (all_required_done && complete > 0) {
    return Close(complete, total_weight, /*quorum_close=*/false);
  }
  // No live worker takes part in the open round: each of them joined at a
  // later one (every worker healed or rejoined and fetched the anchor that
  // starts the next round), so no contribution can complete it. It closes
  // with what it holds (its mean 0 where nothing came: the outer step moves
  // the anchor by momentum alone), so that they get the update they owe.
  // Only in a job that states its rounds: without them, a worker that
  // joined after the last round would look the same, and the job's final
  // anchor must not move.
  if (!any_missing && complete == 0 && live_workers_ > 0 &&
      !HasWorkerWithoutRound() && open_ < options_.rounds) {
    return Close(0, 0, /*quorum_close=*/false);
  }
  if (!deadline_.has_value() || clock_->Now() < *deadline_) {
    return std::nullopt;
  }
  if (complete == 0 || complete < options_.min_workers) {
    if (!miss_counted_) {
      miss_counted_ = true;
      ++quorum_misses_;
    }
    return std::nullopt;
  }
  return Close(complete, total_weight, /*quorum_close=*/true);
}

std::vector<CompleteChunk> RoundState::TakeCompleteChunks() {
  std::vector<CompleteChunk> complete;
  if (required_ > 0) {
    std::sort(ready_.begin(), ready_.end());
    ready_.erase(std::unique(ready_.begin(), ready_.end()), ready_.end());
    for (const uint32_t c : ready_) {
      if (taken_.Test(c) || senders_[c] != required_) continue;
      taken_.Set(c);
      CompleteChunk chunk{c, 0, {}, {}};
      chunk.mean = TakeMean(Slot(open_), c, &chunk.held_out);
      chunk.contributors = ChunkContributors(required_, chunk.held_out, c);
      complete.push_back(std::move(chunk));
    }
  }
  ready_.clear();
  return complete;
}

std::vector<ChunkSender> RoundState::SendersOf(uint32_t chunk_index) const {
  std::vector<ChunkSender> senders;
  for (const auto& [id, w] : workers_) {
    if (w.received[kOpen].Test(chunk_index)) {
      senders.push_back(ChunkSender{id, w.weight0[kOpen]});
    }
  }
  return senders;
}

void RoundState::RestoreTakenChunk(uint32_t chunk_index,
                                   const std::vector<ChunkSender>& senders) {
  assert(chunk_index < num_chunks_);
  for (const ChunkSender& sender : senders) {
    Worker& w = RecordOf(sender.worker);
    w.received[kOpen].Set(chunk_index);
    if (sender.contribution_weight > 0) {
      w.weight0[kOpen] = sender.contribution_weight;
    }
  }
  taken_.Set(chunk_index);
  RecountSenders();
}

std::vector<float> RoundState::TakeMean(int slot, uint32_t chunk_index,
                                        std::vector<HeldOut>* held_out) {
  ChunkSum& sum = AccumulatorOf(slot, chunk_index);
  if (options_.outlier_ratio > 0) {
    const ChunkScreen::Settled settled = screens_[slot][chunk_index].Settle(
        options_.outlier_ratio, chunk_index,
        [&](common::Codec codec, common::Pieces payload, float w) {
          return sum.Add(codec, payload, w);
        },
        held_out);
    if (settled.median.has_value()) last_median_[chunk_index] = settled.median;
    max_norm_ratio_ = std::max(max_norm_ratio_, settled.max_ratio);
  }
  std::vector<float> mean = sum.TakeMean();
  std::unique_ptr<ChunkSum>& acc = acc_[slot][chunk_index];
  if (acc->size() == common::kChunkElements) spare_.push_back(std::move(acc));
  acc.reset();
  return mean;
}

ClosedRound RoundState::Close(uint32_t contributors, double total_weight,
                              bool quorum_close) {
  const int slot = Slot(open_);
  ClosedRound closed;
  closed.round = open_;
  closed.contributors = contributors;
  closed.total_weight = total_weight;
  closed.quorum_close = quorum_close;
  closed.mean.resize(num_chunks_);
  for (uint32_t c = 0; c < num_chunks_; ++c) {
    if (!taken_.Test(c)) closed.mean[c] = TakeMean(slot, c, &closed.held_out);
  }
  closed.max_norm_ratio = max_norm_ratio_;
  max_norm_ratio_ = 0;
  if (quorum_close) {
    for (auto& [id, w] : workers_) {
      if (Required(w) && w.received[kOpen].count() < num_chunks_) {
        w.missed = true;
      }
    }
  }
  acc_[slot].clear();
  taken_.Clear();

  has_chunk_[slot] = false;
  if (!quorum_close && deadline_.has_value()) {
    deadline_rule_.Observe(clock_->Now() - armed_at_);
  }
  ++open_;
  deadline_.reset();
  if (has_chunk_[Slot(open_)]) ArmDeadline();
  miss_counted_ = false;

  for (auto it = workers_.begin(); it != workers_.end();) {
    Worker& w = it->second;
    std::swap(w.received[kPrev], w.received[kOpen]);
    std::swap(w.received[kOpen], w.received[kNext]);
    w.received[kNext].Clear();
    w.weight0 = {w.weight0[kOpen], w.weight0[kNext], 0};
    if (!w.live && w.received[kPrev].count() == 0 &&
        w.received[kOpen].count() == 0) {
      workers_.erase(it++);
    } else {
      ++it;
    }
  }
  RecountSenders();
  return closed;
}

void RoundState::RecountSenders() {
  required_ = 0;
  std::fill(senders_.begin(), senders_.end(), 0);
  for (const auto& [id, w] : workers_) {
    if (!Required(w)) continue;
    ++required_;
    const ChunkSet& sent = w.received[kOpen];
    if (sent.count() == 0) continue;
    for (uint32_t c = 0; c < num_chunks_; ++c) senders_[c] += sent.Test(c);
  }
  ready_.clear();
  if (required_ == 0) return;
  for (uint32_t c = 0; c < num_chunks_; ++c) {
    if (senders_[c] == required_) ready_.push_back(c);
  }
}

void RoundState::Reopen(uint64_t round) {
  assert(!has_chunk_[0] && !has_chunk_[1]);
  open_ = round;
  deadline_.reset();
  miss_counted_ = false;
  RecountSenders();
}

uint64_t RoundState::open_round() const { return open_; }

uint32_t RoundState::num_chunks() const { return num_chunks_; }

size_t RoundState::ChunkElements(uint32_t chunk_index) const {
  if (chunk_index >= num_chunks_) return 0;
  return common::ChunkRange(options_.shard_elements, chunk_index).size();
}

std::optional<absl::Time> RoundState::Deadline() const { return deadline_; }

void RoundState::ArmDeadline() {
  armed_at_ = clock_->Now();
  deadline_ = armed_at_ + deadline_rule_.Current();
}

uint64_t RoundState::quorum_misses() const { return quorum_misses_; }

std::string RoundState::CountedInPreviousRound(std::string_view worker) const {
  auto it = workers_.find(AsAbsl(worker));
  if (it == workers_.end() || it->second.received[kPrev].count() == 0) return {};
  std::string bits((num_chunks_ + 7) / 8, '\0');
  for (uint32_t c = 0; c < num_chunks_; ++c) {
    if (it->second.received[kPrev].Test(c)) bits[c / 8] |= char(1 << (c % 8));
  }
  return bits;
}

void RoundState::RestoreCountedInPreviousRound(std::string_view worker,
                                               std::string_view bits) {
  auto it = workers_.find(AsAbsl(worker));
  if (it == workers_.end()) return;
  for (uint32_t c = 0; c < num_chunks_ && c / 8 < bits.size(); ++c) {
    if ((bits[c / 8] >> (c % 8)) & 1) it->second.received[kPrev].Set(c);
  }
}

}  // namespace co2::server
