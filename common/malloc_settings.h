// glibc's malloc, set for a process that allocates and frees buffers of
// 1–32 MiB over and over: a shard (gRPC's receive slices and messages,
// update chunks, accumulators, every round) and a training process
// (LibTorch's activations and gradients, every step). A binary's main calls
// it first; a library never does (the allocator belongs to the program that
// links it).
#ifndef CO2_COMMON_MALLOC_SETTINGS_H_
#define CO2_COMMON_MALLOC_SETTINGS_H_

namespace co2::common {

// One arena; buffers up to 32 MiB (glibc's largest mmap threshold) come from
// the heap, and up to 64 MiB of free heap stay mapped for the next ones.
//
// With glibc's defaults each such buffer is a fresh mapping (or heap that
// was trimmed and grows again), and the kernel faults in and zeroes its
// pages every time: a fifth of a shard's CPU in a round, and a quarter of a
// training step of co2-train's wide model on CPU. One arena because with
// several each reactor thread allocates from its own and the poller frees
// into them, which fragments them (docs/performance.md).
void KeepLargeBuffersInHeap();

}  // namespace co2::common

#endif  // CO2_COMMON_MALLOC_SETTINGS_H_
