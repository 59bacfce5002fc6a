#include "server/job/update_messages.h"

#include <utility>

namespace co2::server {

UpdateMessages::UpdateMessages(const v1::JobConfig& config,
                               uint32_t num_chunks)
    : downlink_(v1::Codec(config.downlink_codec())),
      max_staleness_(config.max_staleness()),
      num_chunks_(num_chunks) {}

std::shared_ptr<const v1::OuterUpdate> UpdateMessages::Make(
    uint64_t round, uint32_t chunk_index, uint32_t contributors,
    std::string payload, uint64_t anchor_digest,
    const std::vector<HeldOut>& held_out) const {
  auto msg = std::make_shared<v1::OuterUpdate>();
  msg->set_round(round);
  msg->set_anchor_round(round + 1 + max_staleness_);
  msg->set_chunk_index(chunk_index);
  msg->set_num_chunks(num_chunks_);
  msg->set_codec(downlink_);
  msg->set_contributors(contributors);
  msg->set_payload(std::move(payload));
  msg->set_anchor_digest(anchor_digest);
  for (const HeldOut& out : held_out) {
    if (out.chunk_index != chunk_index) continue;
    v1::HeldOutContribution* named = msg->add_held_out();
    named->set_worker_id(out.worker);
    named->set_reason(out.reason);
  }
  return msg;
}

}  // namespace co2::server
