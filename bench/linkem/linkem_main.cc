// co2-linkem: a link emulator for the benchmarks' network namespaces, where
// this kernel has no netem. It serves one netfilter queue (iptables'
// NFQUEUE target, bench/linkem/linkem.sh puts the rule on a namespace's
// ingress) and holds every packet for --delay_ms before letting it through,
// dropping a --loss share of them on arrival. Packets are not copied to user
// space (metadata only); without loss GSO packets stay whole, so the cost is
// per 64 KiB segment, not per 1.5 KB frame.
//
// Runs until SIGTERM or SIGINT, then lets every held packet through and
// writes one JSON line to --stats (or stdout): what it did and the CPU it
// used.
//   co2-linkem --queue=0 --delay_ms=25 --loss=0.001 [--seed=1] [--stats=F]
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

extern "C" {
#include <libnetfilter_queue/libnetfilter_queue.h>
}

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "bench/linkem/delay_line.h"

ABSL_FLAG(int, queue, 0, "The netfilter queue number to serve (0-65535).");
ABSL_FLAG(double, delay_ms, 0.0, "One-way delay added to every packet.");
ABSL_FLAG(double, loss, 0.0, "Share of packets dropped, in [0, 1).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the loss draws.");
ABSL_FLAG(int, max_held, 1 << 16,
          "Most packets the kernel's queue holds; more are dropped.");
ABSL_FLAG(std::string, stats, "", "Write the final JSON line here.");

namespace {

using co2::bench::DelayLine;

int64_t NowNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

struct Queue {
  DelayLine* line;
  nfq_q_handle* handle = nullptr;
  uint64_t verdict_failures = 0;
};

// One packet's notification: hold it or drop it now.
int OnPacket(nfq_q_handle* handle, nfgenmsg*, nfq_data* data, void* arg) {
  auto* queue = static_cast<Queue*>(arg);
  const nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(data);
  if (header == nullptr) return 0;
  const uint32_t id = ntohl(header->packet_id);
  if (!queue->line->Arrive(id, NowNs()) &&
      nfq_set_verdict(handle, id, NF_DROP, 0, nullptr) < 0) {
    ++queue->verdict_failures;
  }
  return 0;
}

void ReleaseDue(Queue& queue, int64_t now_ns) {
  if (auto last = queue.line->ReleaseDue(now_ns)) {
    if (nfq_set_verdict_batch(queue.handle, *last, NF_ACCEPT) < 0) {
      ++queue.verdict_failures;
    }
  }
}

double CpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

int Fail(const std::string& what) {
  std::cerr << "co2-linkem: " << what << ": " << std::strerror(errno) << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "co2-linkem --queue=N --delay_ms=D [--loss=P]: holds each packet of "
      "netfilter queue N for D ms, dropping a share P of them");
  absl::ParseCommandLine(argc, argv);
  const int queue_number = absl::GetFlag(FLAGS_queue);
  if (queue_number < 0 || queue_number > 65535) {
    std::cerr << "co2-linkem: --queue is " << queue_number
              << ": must be in [0, 65535]\n";
    return 2;
  }
  auto line = DelayLine::Create(
      {static_cast<int64_t>(std::llround(absl::GetFlag(FLAGS_delay_ms) * 1e6)),
       absl::GetFlag(FLAGS_loss), absl::GetFlag(FLAGS_seed)});
  if (!line.ok()) {
    std::cerr << "co2-linkem: " << line.status().message() << "\n";
    return 2;
  }

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigprocmask(SIG_BLOCK, &stop_signals, nullptr);
  const int signal_fd = signalfd(-1, &stop_signals, SFD_CLOEXEC);
  if (signal_fd < 0) return Fail("signalfd");

  nfq_handle* nfq = nfq_open();
  if (nfq == nullptr) return Fail("nfq_open (needs root and nfnetlink_queue)");
  Queue queue{&*line};
  queue.handle = nfq_create_queue(nfq, queue_number, &OnPacket, &queue);
  if (queue.handle == nullptr) {
    return Fail(absl::StrCat("cannot bind queue ", queue_number,
                             " (another listener on it?)"));
  }
  if (nfq_set_mode(queue.handle, NFQNL_COPY_META, 0) < 0) {
    return Fail("nfq_set_mode");
  }
  if (nfq_set_queue_maxlen(queue.handle, absl::GetFlag(FLAGS_max_held)) < 0) {
    return Fail("nfq_set_queue_maxlen");
  }
  // Without loss, GSO packets (up to 64 KiB) are queued whole, which costs
  // less CPU. With loss the kernel segments them first, so that a drop
  // takes one wire-sized packet, not a burst of up to 44.
  if (absl::GetFlag(FLAGS_loss) == 0.0) {
    nfq_set_queue_flags(queue.handle, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
  }
  nfnl_rcvbufsiz(nfq_nfnlh(nfq), 64 << 20);
  const int queue_fd = nfq_fd(nfq);

  uint64_t lost_notifications = 0;
  alignas(8) static char buffer[1 << 16];
  bool stop = false;
  while (!stop) {
    timespec timeout{1, 0};
    if (auto due = queue.line->NextDue()) {
      const int64_t wait = std::max<int64_t>(0, *due - NowNs());
      timeout = {static_cast<time_t>(wait / 1000000000),
                 static_cast<long>(wait % 1000000000)};
    }
    pollfd fds[2] = {{queue_fd, POLLIN, 0}, {signal_fd, POLLIN, 0}};
    const int ready = ppoll(fds, 2, &timeout, nullptr);
    if (ready < 0 && errno != EINTR) return Fail("ppoll");
    if (ready > 0 && (fds[1].revents & POLLIN)) stop = true;
    if (ready > 0 && (fds[0].revents & POLLIN)) {
      // Everything pending, without blocking, before the next due time.
      for (;;) {
        const ssize_t n = recv(queue_fd, buffer, sizeof(buffer), MSG_DONTWAIT);
        if (n < 0 && errno == ENOBUFS) {
          ++lost_notifications;  // the next batch verdict releases them
          continue;
        }
        if (n <= 0) break;
        nfq_handle_packet(nfq, buffer, static_cast<int>(n));
        ReleaseDue(queue, NowNs());
      }
    }
    ReleaseDue(queue, NowNs());
  }
  ReleaseDue(queue, INT64_MAX);
  nfq_destroy_queue(queue.handle);
  nfq_close(nfq);

  const co2::bench::DelayLineStats& stats = queue.line->stats();
  const std::string json = absl::StrCat(
      "{\"queue\": ", queue_number, ", \"delay_ms\": ",
      absl::GetFlag(FLAGS_delay_ms), ", \"loss\": ", absl::GetFlag(FLAGS_loss),
      ", \"packets\": ", stats.arrived, ", \"dropped\": ", stats.dropped,
      ", \"released\": ", stats.released, ", \"max_held\": ", stats.max_held,
      ", \"lost_notifications\": ", lost_notifications,
      ", \"verdict_failures\": ", queue.verdict_failures,
      ", \"cpu_s\": ", CpuSeconds(), "}\n");
  const std::string path = absl::GetFlag(FLAGS_stats);
  if (path.empty()) {
    std::cout << json;
  } else {
    std::ofstream(path) << json;
  }
  return 0;
}
