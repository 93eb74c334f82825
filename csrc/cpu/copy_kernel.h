// The CPU executor: every pair it accepts becomes an entry of one flat work list, copied in one
// pass split across threads. Pairs it cannot reproduce bit for bit are refused (stock takes them).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "planner/tuning.h"

namespace npu_dispatch {

enum class CopyOp : uint8_t { Memcpy, F32ToBF16, BF16ToF32, F32ToF16, F16ToF32, Count };

struct WorkItem {
  char* dst;
  const char* src;
  int64_t n;  // elements (bytes for Memcpy)
  int64_t exact_len;  // F16ToF32 under FBGEMM: elements past this take FBGEMM's scalar tail
  CopyOp op;
};

struct KernelConfig;
struct ConvertFns;


class CpuCopyBatch {
 public:
  // Uses the configuration the self-check published (none yet: only same-dtype byte copies).
  // Constructed on the calling thread: FBGEMM's fp16 -> fp32 split follows its thread count.
  CpuCopyBatch();
  explicit CpuCopyBatch(const KernelConfig* config) : config_(config), split_threads_(caller_threads()) {}

  // A fast-route pair (dense, equal strides, no conj/neg bit, non-empty).
  bool add_pair(const at::Tensor& dst, const at::Tensor& src);
  // A coalesced run of contiguous pairs, as one entry where the conversion is position-free.
  bool add_run(at::TensorList dsts, at::TensorList srcs, const int64_t* members, int64_t count,
               int64_t numel);
  // The one-pass plan's steps (planner/one_pass.cpp). dtype_op: the op for a dtype pair, false where this
  // kernel does not reproduce stock's bits; `mergeable` when adjacent pairs may share one item.
  bool dtype_op(at::ScalarType src, at::ScalarType dst, CopyOp* op, bool* mergeable) const;
  // The conversion loops of a cast dtype_op() accepted (the published configuration's variant).
  const ConvertFns* fns(CopyOp op) const;
  // One contiguous pair of a dtype pair dtype_op() called mergeable, inline (the one-pass plan adds one per
  // separately allocated pair): `n` as WorkItem::n; with `extend` it continues the last item
  // (adjacent in memory, same op).
  void add_contiguous(char* dst, const char* src, int64_t n, CopyOp op, bool extend) {
    if (extend) {
      items_.back().n += n;
      items_.back().exact_len += n;
    } else {
      items_.push_back({dst, src, n, n, op});
    }
  }
  // One contiguous fp16 -> fp32 pair of `numel` (> 0) elements where dtype_op() said not mergeable
  // (FBGEMM's split): its own chunks, as stock copies it.
  void add_fbgemm_f16_to_f32(char* dst, const char* src, int64_t numel);
  void reserve(size_t n) { items_.reserve(n); }
  // Back to an empty batch with the published configuration, keeping the lists' storage.
  // `split_threads`: caller_threads() as read on the thread that will run the copy's
  // parallel_for (the threaded checks resets each share on its own worker, inside its region).
  void reset(int64_t split_threads);
  // The thread count FBGEMM's fp16 -> fp32 split follows for a copy called from this thread.
  static int64_t caller_threads();
  // Copies every item: on the calling thread up to `serial_moved_bytes` read plus written, else
  // split by destination bytes across threads (at::parallel_for); byte copies with streaming
  // stores where streams() says so. Empties the work list.
  void run(int64_t serial_moved_bytes = kSerialMovedBytes);
  bool empty() const { return items_.empty(); }
  size_t size() const { return items_.size(); }

  // A pass split by the caller (the threaded checks): finish() once, then copy_bytes() over any
  // split of [0, total_bytes()), then count_pass() once. The work list must not change between.
  void finish();
  int64_t total_bytes() const { return total_; }  // destination bytes
  int64_t moved_bytes() const { return moved_; }  // read plus written
  // Whether a pass moving `moved_bytes` (read plus written, the whole call's) streams its byte
  // copies: at or above stream_moved_bytes() (cpu/stream_copy.h) its bytes cannot stay in cache.
  static bool streams(int64_t moved_bytes);
  // Items are disjoint, so their order is free: `backward` copies the range's items last to
  // first (each item still front to back). `stream`: byte copies with streaming stores, then
  // this thread's fence.
  void copy_bytes(int64_t begin, int64_t end, bool backward, bool stream) const;
  // The direction of this thread's next pass: each call flips it. A list copied again and again
  // whose bytes are about the size of a core's L2 (the small_many workload) then starts each
  // pass on the lines the last pass touched last, which are still cached; in one direction every
  // pass can evict its own next lines first and run at L3 speed.
  static bool alternate();
  // One pass of `items` work items, `bytes` destination bytes, `streamed` of them in the copies
  // made with streaming stores (kernel_counters; fsdp/chunk_cat_kernel.h counts its pass here too).
  static void count_pass(int64_t items, int64_t bytes, int64_t streamed = 0);

 private:
  const KernelConfig* config_;
  int64_t split_threads_;
  std::vector<WorkItem> items_;
  std::vector<int64_t> ends_;  // destination bytes up to the end of each item (finish())
  int64_t total_ = 0, moved_ = 0;
};

// Checks every conversion against stock copy_ on this machine and enables only the exact ones.
// Returns one flag per CopyOp (1 enabled) followed by the variant used (0 none, 1 DEFAULT,
// 2 AVX2, 3 AVX512) and whether FBGEMM's split is emulated, per conversion.
// The conversion variant whose fp16 -> fp32 widening is ATen's copy kernel's (TensorIterator's loop,
// which stock's cat casts with), as self_check() found it; nullptr before it or where none matched.
const ConvertFns* iterator_f16_to_f32_fns();

// What self_check() found per conversion: whether the kernel matched stock, with which of ATen's
// CPU capability variants ("none", "DEFAULT", "AVX2", "AVX512"), and whether fp16 conversions follow
// FBGEMM's split of a tensor into a vector body and a scalar tail.
struct ConversionCheck {
  const char* conversion;  // "f32->bf16", "bf16->f32", "f32->f16", "f16->f32"
  bool enabled;
  const char* variant;
  bool fbgemm_split;
};
std::vector<ConversionCheck> self_check();

// passes, items, bytes, bytes of the copies made with streaming stores (each copy's unaligned
// head and tail and chunk_cat's padding store normally): only this kernel moves them (tests use
// it to see the C++ path ran).
std::vector<int64_t> kernel_counters();

}  // namespace npu_dispatch
