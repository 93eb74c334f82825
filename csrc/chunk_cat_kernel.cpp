// chunk_cat_kernel.h: the pass split across threads by out's elements; widening casts run the
// conversion variant's own instance of the pass (its loop inlined), byte copies this one.
#include "chunk_cat_kernel.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include "cpu_convert.h"
#include "cpu_copy_kernel.h"
#include "stream_copy.h"
#include "tuning.h"

namespace npu_dispatch {

bool run_chunk_cat(const ChunkCatLayout& l, int64_t* pairs) {
  CpuCopyBatch kernel;
  CopyOp op;
  bool mergeable = false;
  if (!kernel.route(l.in_dtype, l.out_dtype, &op, &mergeable) || !mergeable) return false;
  if (op != CopyOp::Memcpy && op != CopyOp::BF16ToF32 && op != CopyOp::F16ToF32) {
    return false;  // a narrowing cast: stock's cat rounds it
  }
  const int64_t out_numel = l.pre * l.num_chunks * l.width;
  const int64_t ies = static_cast<int64_t>(c10::elementSize(l.in_dtype));
  const int64_t oes = static_cast<int64_t>(c10::elementSize(l.out_dtype));
  int64_t in_numel = 0;
  *pairs = 0;
  for (const auto& t : l.sources) {
    in_numel += l.pre * t.rows * t.post;
    *pairs += l.pre * ((t.rows + t.chunk - 1) / t.chunk);
  }
  const int64_t moved = in_numel * ies + out_numel * oes;
  bool stream = CpuCopyBatch::streams(moved);
  ChunkCatPass widen = nullptr;
  if (op != CopyOp::Memcpy) {
    const ConvertFns& f = *kernel.fns(op);
    const bool bf16 = op == CopyOp::BF16ToF32;
    const ChunkCatPass streamed = bf16 ? f.chunk_cat_bf16_to_f32_stream : f.chunk_cat_f16_to_f32_stream;
    stream = stream && streamed != nullptr;  // a variant without streaming stores stores normally
    widen = stream ? streamed : bf16 ? f.chunk_cat_bf16_to_f32 : f.chunk_cat_f16_to_f32;
  }
  auto range = [&](int64_t lo, int64_t hi) {
    if (widen != nullptr) {
      widen(l, lo, hi);
      if (stream) stream_fence();
    } else if (stream) {
      chunk_cat_range(l, ies, oes, lo, hi, [oes](char* d, const char* s, int64_t n) { stream_copy(d, s, n * oes); });
      stream_fence();  // the weakly ordered stores done before the range counts as copied
    } else {
      chunk_cat_range(l, ies, oes, lo, hi, [oes](char* d, const char* s, int64_t n) { std::memcpy(d, s, n * oes); });
    }
  };
  {
    RECORD_FUNCTION("npu_dispatch::cpu_kernel", std::vector<c10::IValue>());
    if (moved <= kSerialMovedBytes) {
      range(0, out_numel);
    } else {
      at::parallel_for(0, out_numel, std::max<int64_t>(1, kCopyGrainBytes / oes), range);
    }
  }
  CpuCopyBatch::count_pass(*pairs, out_numel * oes, stream ? out_numel * oes : 0);
  return true;
}

}  // namespace npu_dispatch
