// libco2_copy_counter.so: an LD_PRELOAD library that counts the bytes a
// process copies with memcpy/memmove/mempcpy (and their _chk forms), by
// caller, and the bytes it moves through socket system calls (recvmsg,
// sendmsg, read, write, ...: the kernel's copies). At exit it writes a JSON
// report to $CO2_COPY_COUNTER_OUT. bench/aggregator_bench preloads it into
// the shards to show where payload bytes are copied (docs/performance.md).
//
// Copies of at least kSiteBytes are attributed to their immediate caller
// (return address → shared object + dynamic symbol, or object + offset for
// a stripped or static function; bench/run_aggregator.sh symbolises those
// with addr2line). Smaller copies are only totalled. Counting is lock-free;
// the report runs in a destructor, after main returns.
//
// Built with -fno-builtin and without loop-pattern distribution, so that
// its own copy loop is not turned back into a call to memcpy.
#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr size_t kSiteBytes = 4096;
constexpr size_t kSites = 4096;  // open addressing on the return address

struct Site {
  std::atomic<uintptr_t> caller{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> calls{0};
};

Site g_sites[kSites];
std::atomic<uint64_t> g_copy_bytes{0}, g_copy_calls{0};
std::atomic<uint64_t> g_small_bytes{0};
std::atomic<uint64_t> g_lost_sites{0};
std::atomic<uint64_t> g_recv_bytes{0}, g_send_bytes{0};

using CopyFn = void* (*)(void*, const void*, size_t);
std::atomic<CopyFn> g_memmove{nullptr};
std::atomic<bool> g_resolving{false};

// Before dlsym has found libc's memmove (dlsym itself copies), a plain loop.
void* SlowMove(void* dst, const void* src, size_t n) {
  auto* d = static_cast<volatile unsigned char*>(dst);
  auto* s = static_cast<const volatile unsigned char*>(src);
  if (d < s) {
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
  } else {
    for (size_t i = n; i > 0; --i) d[i - 1] = s[i - 1];
  }
  return dst;
}

void* Move(void* dst, const void* src, size_t n) {
  CopyFn fn = g_memmove.load(std::memory_order_acquire);
  if (fn == nullptr) {
    if (g_resolving.exchange(true)) return SlowMove(dst, src, n);
    fn = reinterpret_cast<CopyFn>(dlsym(RTLD_NEXT, "memmove"));
    g_memmove.store(fn, std::memory_order_release);
    g_resolving.store(false);
    if (fn == nullptr) return SlowMove(dst, src, n);
  }
  return fn(dst, src, n);
}

void Count(void* caller, size_t n) {
  g_copy_bytes.fetch_add(n, std::memory_order_relaxed);
  g_copy_calls.fetch_add(1, std::memory_order_relaxed);
  if (n < kSiteBytes) {
    g_small_bytes.fetch_add(n, std::memory_order_relaxed);
    return;
  }
  const auto key = reinterpret_cast<uintptr_t>(caller);
  size_t slot = (key >> 4) * 0x9E3779B97F4A7C15ull >> 52;  // 12 bits
  for (size_t probe = 0; probe < kSites; ++probe, slot = (slot + 1) % kSites) {
    uintptr_t seen = g_sites[slot].caller.load(std::memory_order_relaxed);
    if (seen == 0 && g_sites[slot].caller.compare_exchange_strong(seen, key)) {
      seen = key;
    }
    if (seen == key) {
      g_sites[slot].bytes.fetch_add(n, std::memory_order_relaxed);
      g_sites[slot].calls.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  g_lost_sites.fetch_add(n, std::memory_order_relaxed);
}

template <typename Fn>
Fn Next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

bool IsSocket(int fd) {
  int type = 0;
  socklen_t len = sizeof type;
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0;
}

void JsonEscaped(FILE* f, const char* s) {
  std::fputc('"', f);
  for (; s != nullptr && *s != '\0'; ++s) {
    if (*s == '"' || *s == '\\') std::fputc('\\', f);
    if (static_cast<unsigned char>(*s) >= 0x20) std::fputc(*s, f);
  }
  std::fputc('"', f);
}

__attribute__((destructor)) void Report() {
  const char* path = std::getenv("CO2_COPY_COUNTER_OUT");
  if (path == nullptr) return;
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return;
  std::fprintf(f,
               "{\"memcpy_bytes\": %llu, \"memcpy_calls\": %llu, "
               "\"memcpy_bytes_in_small_calls\": %llu, "
               "\"memcpy_bytes_unattributed\": %llu, "
               "\"socket_bytes_received\": %llu, \"socket_bytes_sent\": %llu, "
               "\"site_min_bytes\": %zu, \"sites\": [",
               static_cast<unsigned long long>(g_copy_bytes.load()),
               static_cast<unsigned long long>(g_copy_calls.load()),
               static_cast<unsigned long long>(g_small_bytes.load()),
               static_cast<unsigned long long>(g_lost_sites.load()),
               static_cast<unsigned long long>(g_recv_bytes.load()),
               static_cast<unsigned long long>(g_send_bytes.load()),
               kSiteBytes);
  bool first = true;
  for (const Site& site : g_sites) {
    const uintptr_t caller = site.caller.load();
    if (caller == 0) continue;
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(caller), &info);
    const uintptr_t base = reinterpret_cast<uintptr_t>(info.dli_fbase);
    int status = -1;
    char* demangled =
        info.dli_sname == nullptr
            ? nullptr
            : abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::fprintf(f, "%s\n  {\"object\": ", first ? "" : ",");
    JsonEscaped(f, info.dli_fname != nullptr ? info.dli_fname : "?");
    std::fprintf(f, ", \"offset\": \"0x%llx\", \"symbol\": ",
                 static_cast<unsigned long long>(caller - base));
    JsonEscaped(f, status == 0
                       ? demangled
                       : (info.dli_sname != nullptr ? info.dli_sname : ""));
    std::fprintf(f, ", \"bytes\": %llu, \"calls\": %llu}",
                 static_cast<unsigned long long>(site.bytes.load()),
                 static_cast<unsigned long long>(site.calls.load()));
    std::free(demangled);
    first = false;
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

}  // namespace

extern "C" {

void* memcpy(void* dst, const void* src, size_t n) noexcept {
  Count(__builtin_return_address(0), n);
  return Move(dst, src, n);
}

void* memmove(void* dst, const void* src, size_t n) noexcept {
  Count(__builtin_return_address(0), n);
  return Move(dst, src, n);
}

void* mempcpy(void* dst, const void* src, size_t n) noexcept {
  Count(__builtin_return_address(0), n);
  return static_cast<char*>(Move(dst, src, n)) + n;
}

void* __memcpy_chk(void* dst, const void* src, size_t n, size_t) noexcept {
  Count(__builtin_return_address(0), n);
  return Move(dst, src, n);
}

void* __memmove_chk(void* dst, const void* src, size_t n, size_t) noexcept {
  Count(__builtin_return_address(0), n);
  return Move(dst, src, n);
}

ssize_t recvmsg(int fd, struct msghdr* msg, int flags) {
  static auto next = Next<ssize_t (*)(int, struct msghdr*, int)>("recvmsg");
  const ssize_t n = next(fd, msg, flags);
  if (n > 0) g_recv_bytes.fetch_add(static_cast<uint64_t>(n));
  return n;
}

ssize_t recv(int fd, void* buf, size_t len, int flags) {
  static auto next = Next<ssize_t (*)(int, void*, size_t, int)>("recv");
  const ssize_t n = next(fd, buf, len, flags);
  if (n > 0) g_recv_bytes.fetch_add(static_cast<uint64_t>(n));
  return n;
}

ssize_t sendmsg(int fd, const struct msghdr* msg, int flags) {
  static auto next =
      Next<ssize_t (*)(int, const struct msghdr*, int)>("sendmsg");
  const ssize_t n = next(fd, msg, flags);
  if (n > 0) g_send_bytes.fetch_add(static_cast<uint64_t>(n));
  return n;
}

ssize_t send(int fd, const void* buf, size_t len, int flags) {
  static auto next = Next<ssize_t (*)(int, const void*, size_t, int)>("send");
  const ssize_t n = next(fd, buf, len, flags);
  if (n > 0) g_send_bytes.fetch_add(static_cast<uint64_t>(n));
  return n;
}

ssize_t readv(int fd, const struct iovec* iov, int count) {
  static auto next = Next<ssize_t (*)(int, const struct iovec*, int)>("readv");
  const ssize_t n = next(fd, iov, count);
  if (n > 0 && IsSocket(fd)) g_recv_bytes.fetch_add(static_cast<uint64_t>(n));
  return n;
}

ssize_t writev(int fd, const struct iovec* iov, int count) {
  static auto next = Next<ssize_t (*)(int, const struct iovec*, int)>("writev");
  const ssize_t n = next(fd, iov, count);
  if (n > 0 && IsSocket(fd)) g_send_bytes.fetch_add(static_cast<uint64_t>(n));
  return n;
}

}  // extern "C"
