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
  // The op for a dtype pair, false where this kernel does not reproduce stock's bits; `mergeable`
  // when adjacent pairs may share one item. Every way into the work list asks it.
  bool dtype_op(at::ScalarType src, at::ScalarType dst, CopyOp* op, bool* mergeable) const;
  // The conversion loops of a cast dtype_op() accepted (the published configuration's variant).
  const ConvertFns* fns(CopyOp op) const;
  // One contiguous pair (or run) of a dtype pair dtype_op() called mergeable, inline: `n` as
  // WorkItem::n; with `extend` it continues the last item (adjacent in memory, same op).
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
  // The thread count FBGEMM's fp16 -> fp32 split follows for a copy called from this thread.
  static int64_t caller_threads();
  // Copies every item in one byte_pass (cpu/byte_pass.h) over the items' destination bytes laid
  // end to end: on the calling thread up to `serial_moved_bytes` read plus written, else split
  // across threads; streaming stores where the pass moves more than the cache holds. Empties the
  // work list.
  void run(int64_t serial_moved_bytes = kSerialMovedBytes);
  bool empty() const { return items_.empty(); }
  size_t size() const { return items_.size(); }

  // The direction of this thread's next pass: each call flips it. A list copied again and again
  // whose bytes are about the size of a core's L2 (the small_many workload) then starts each
  // pass on the lines the last pass touched last, which are still cached; in one direction every
  // pass can evict its own next lines first and run at L3 speed.
  static bool alternate();

 private:
  // Lays the items end to end (ends_, total_, moved_).
  void finish();
  // Copies destination bytes [begin, end) of the items laid end to end; with `backward`, last
  // item first (each item still front to back). Returns the bytes stored with streaming stores
  // (`stream`); byte_pass fences them before the range counts as copied.
  int64_t copy_bytes(int64_t begin, int64_t end, bool backward, bool stream) const;

  const KernelConfig* config_;
  int64_t split_threads_;
  std::vector<WorkItem> items_;
  std::vector<int64_t> ends_;  // destination bytes up to the end of each item (finish())
  int64_t total_ = 0, moved_ = 0;
};

// The (src, dst) dtype pairs the kernel copies bit for bit as stock does (CpuCopyBatch::dtype_op),
// by the configuration the self-check published: the CPU entry of the capability table.
std::vector<std::pair<at::ScalarType, at::ScalarType>> kernel_pairs();

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
// Checks every conversion against stock copy_ on this machine and enables only the exact ones.
std::vector<ConversionCheck> self_check();

}  // namespace npu_dispatch
