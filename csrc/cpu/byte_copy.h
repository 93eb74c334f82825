// Byte copies (no overlap) of the CPU passes, AVX2 where the CPU has it, memcpy elsewhere:
//   - byte_copy, for pieces at any relative alignment: the copy-out's pieces are rows of
//     parameters at any element offset of the all-gather output, so source and destination rarely
//     share their offset within a cache line. On such pieces of FSDP2's sizes a loop of unaligned
//     loads and 32-byte-aligned stores beats glibc's memcpy.
//   - stream_copy, with non-temporal (streaming) stores, for passes that move more bytes than the
//     last-level cache holds. A normal store first reads the destination line into the cache
//     (read for ownership), so a copy far beyond the cache moves each destination byte over the
//     memory bus twice; a streaming store writes the line without reading it. ATen's copy_ and
//     glibc's memcpy below its own threshold both store normally; glibc's streaming path (above
//     about 3/4 of the cache, per call) measured slower than this loop on the CI host.
#pragma once

#include <cstdint>

namespace npu_dispatch {

// Copies `n` bytes: one unaligned 32-byte vector, then 32-byte stores aligned to `dst`, then the
// last vector again over bytes already written with the same bits (memcpy for n < 32).
void byte_copy(char* dst, const char* src, int64_t n);

// Bytes read plus written at or above which a pass streams its stores: the size of the level-3
// (or higher) cache CPU 0 sits under (sysfs), 32 MB where none is listed, at most 96 MiB (a
// virtual machine's slice of a larger package cache: planner/tuning.h); INT64_MAX
// (never) on a CPU without AVX2 streaming stores. The first call reads sysfs: the library's
// load makes it (self_check), not a copy. Below the cache's size normal stores win (the data
// stays cached), beyond it streaming does (a normal store first reads the line it writes).
int64_t stream_moved_bytes();

// Copies `n` bytes (any alignment, no overlap) with AVX2 streaming stores (memcpy on a CPU
// without them). The stores are weakly ordered: the copying thread calls stream_fence()
// before the pass counts as done.
void stream_copy(char* dst, const char* src, int64_t n);
void stream_fence();

}  // namespace npu_dispatch
