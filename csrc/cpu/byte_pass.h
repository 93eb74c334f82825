// The one driver of the byte-split CPU passes: the foreach copy's work list (cpu/copy_kernel.h),
// the copy-out's rows (fsdp/copy_out_kernel.h) and chunk_cat's out (fsdp/chunk_cat_kernel.h).
// As Apex's multi_tensor_apply, a pass is one flat range of destination units, split into chunks
// that threads take; what a chunk's bytes are is the caller's.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cpu/byte_copy.h"
#include "planner/tuning.h"

namespace npu_dispatch {

// Whether a pass moving `moved_bytes` (read plus written, the whole call's) streams its stores:
// at or above stream_moved_bytes() (cpu/byte_copy.h) its bytes cannot stay in cache.
inline bool streams(int64_t moved_bytes) { return moved_bytes >= stream_moved_bytes(); }

// What the CPU passes have done since load; only they move these (tests read them to see that
// the C++ path ran). `streamed`: destination bytes written with streaming stores (each copy's
// unaligned head and tail, and chunk_cat's padding, store normally).
struct KernelCounters {
  int64_t passes = 0, items = 0, bytes = 0, streamed = 0;
};
KernelCounters kernel_counters();
void count_pass(int64_t items, int64_t bytes, int64_t streamed);

// One pass over `units` destination units of `unit_bytes` bytes each, moving `moved_bytes`
// (read plus written): `copy(lo, hi, stream)` writes units [lo, hi) and returns the bytes it
// stored with streaming stores. Each unit is written once: on the calling thread where
// `moved_bytes` <= `serial_moved_bytes`, else in chunks of about kCopyGrainBytes across
// at::parallel_for's threads. `stream` is true where `can_stream` and the pass moves more than
// the cache holds (streams()); a chunk that streamed is fenced on its thread before the pass ends.
// Returns the bytes streamed; counts nothing (byte_pass below counts).
template <typename Copy>
int64_t split_pass(int64_t units, int64_t unit_bytes, int64_t moved_bytes, bool can_stream, const Copy& copy,
                   int64_t serial_moved_bytes = kSerialMovedBytes) {
  if (units <= 0) return 0;
  const bool stream = can_stream && streams(moved_bytes);
  std::atomic<int64_t> streamed{0};
  const auto chunk = [&](int64_t lo, int64_t hi) {
    const int64_t s = copy(lo, hi, stream);
    if (s > 0) {
      stream_fence();  // weakly ordered stores done before this chunk counts as copied
      streamed.fetch_add(s, std::memory_order_relaxed);
    }
  };
  if (moved_bytes <= serial_moved_bytes) {
    chunk(0, units);
  } else {
    at::parallel_for(0, units, std::max<int64_t>(1, kCopyGrainBytes / unit_bytes), chunk);
  }
  return streamed.load(std::memory_order_relaxed);
}

// split_pass, then counted as one pass of `items` work items and units * unit_bytes bytes.
template <typename Copy>
void byte_pass(int64_t units, int64_t unit_bytes, int64_t moved_bytes, int64_t items, bool can_stream,
               const Copy& copy, int64_t serial_moved_bytes = kSerialMovedBytes) {
  const int64_t streamed = split_pass(units, unit_bytes, moved_bytes, can_stream, copy, serial_moved_bytes);
  count_pass(items, std::max<int64_t>(units, 0) * unit_bytes, streamed);
}

}  // namespace npu_dispatch
