// co2-checkpoint: prints what shard checkpoint files hold, one line per file
// (job, shard, range, rounds closed, live members), and with the files of all
// S shards of one job, in shard order, one line with the FNV-1a hash of the
// whole anchor: the hash co2-train reports as each worker's final_hash, so
// an operator (or tests/fault_training_test.sh) can check that workers and
// shards hold the same anchor bit for bit. Exit status 1 when a file fails
// verification or the files are not one job's shards in order.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/fnv_hash.h"
#include "server/job/job_lifecycle.h"
#include "server/storage/checkpoint_store.h"

namespace {

constexpr char kUsage[] =
    "usage: co2-checkpoint FILE...\n"
    "  Prints what co2-aggregator checkpoint files hold, one line per file:\n"
    "  job, shard, element range, rounds closed, live members. Given the\n"
    "  <job>.shard-<i>-of-<S>.ckpt files of all S shards of one job (from\n"
    "  each shard's --checkpoint_dir), in shard order, it also prints the\n"
    "  FNV-1a hash of the whole anchor (anchor_fnv1a=), the hash co2-train\n"
    "  reports as each worker's final_hash.\n"
    "  Exit status: 0 done; 1 a file fails verification or the files are not\n"
    "  one job's shards in order; 2 usage error.\n";

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg.size() > 1 && arg[0] == '-') {
      std::fprintf(stderr, "co2-checkpoint: unknown option '%s'\n%s",
                   arg.c_str(), kUsage);
      return 2;
    }
  }
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::vector<co2::server::LoadedCheckpoint> loaded;
  for (int i = 1; i < argc; ++i) {
    auto checkpoint = co2::server::CheckpointStore::Load(argv[i]);
    if (!checkpoint.ok()) {
      std::fprintf(stderr, "co2-checkpoint: %s: %s\n", argv[i],
                   checkpoint.status().ToString().c_str());
      return 1;
    }
    const co2::v1::ShardCheckpointHeader& h = checkpoint->header;
    std::printf(
        "file=%s job=%s shard=%u/%u range=[%llu,%llu) rounds_closed=%llu "
        "members=%d state=%s\n",
        argv[i], h.job().c_str(), h.shard_index(), h.config().num_shards(),
        static_cast<unsigned long long>(h.range_begin()),
        static_cast<unsigned long long>(h.range_end()),
        static_cast<unsigned long long>(h.rounds_closed()), h.members_size(),
        std::string(co2::server::JobStateName(h.state())).c_str());
    loaded.push_back(*std::move(checkpoint));
  }
  const co2::v1::ShardCheckpointHeader& first = loaded[0].header;
  if (loaded.size() != first.config().num_shards()) return 0;
  uint64_t hash = co2::common::kFnv1aOffset;
  uint64_t next_begin = 0;
  for (size_t i = 0; i < loaded.size(); ++i) {
    const co2::v1::ShardCheckpointHeader& h = loaded[i].header;
    if (h.job() != first.job() || h.shard_index() != i ||
        h.range_begin() != next_begin || h.rounds_closed() != first.rounds_closed()) {
      std::fprintf(stderr,
                   "co2-checkpoint: %s is not shard %zu of job %s at round %llu "
                   "(it is shard %u of %s at round %llu)\n",
                   argv[i + 1], i, first.job().c_str(),
                   static_cast<unsigned long long>(first.rounds_closed()),
                   h.shard_index(), h.job().c_str(),
                   static_cast<unsigned long long>(h.rounds_closed()));
      return 1;
    }
    hash = co2::common::Fnv1a(loaded[i].anchor, hash);
    next_begin = h.range_end();
  }
  std::printf("job=%s rounds_closed=%llu parameters=%llu anchor_fnv1a=%s\n",
              first.job().c_str(),
              static_cast<unsigned long long>(first.rounds_closed()),
              static_cast<unsigned long long>(next_begin),
              absl::StrFormat("%016x", hash).c_str());
  return 0;
}
