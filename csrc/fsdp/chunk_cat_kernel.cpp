// ChunkCatKernel (fsdp/chunk_cat_layout.h): widening casts run the conversion variant's own instance of
// fsdp/chunk_cat_kernel.h's pass (its loop inlined), byte copies this one.
#include "fsdp/chunk_cat_kernel.h"


#include "cpu/byte_pass.h"
#include "cpu/convert.h"
#include "cpu/copy_kernel.h"
#include "cpu/byte_copy.h"

namespace npu_dispatch {

bool ChunkCatKernel::init(c10::ScalarType in_dtype, c10::ScalarType out_dtype, bool through_cat) {
  CpuCopyBatch kernel;
  CopyOp op;
  bool mergeable = false;
  if (!kernel.dtype_op(in_dtype, out_dtype, &op, &mergeable)) return false;
  if (op != CopyOp::Memcpy && op != CopyOp::BF16ToF32 && op != CopyOp::F16ToF32) {
    return false;  // a narrowing cast: stock's cat rounds it
  }
  const ConvertFns* f = kernel.fns(op);
  if (!mergeable) {
    // fp16 -> fp32 where copy_ splits it FBGEMM's way: cat's cast is ATen's copy kernel.
    f = through_cat ? iterator_f16_to_f32_fns() : nullptr;
    if (f == nullptr) return false;
  }
  oes_ = static_cast<int64_t>(c10::elementSize(out_dtype));
  cast_ = op != CopyOp::Memcpy;
  if (cast_) {
    const bool bf16 = op == CopyOp::BF16ToF32;
    widen_ = bf16 ? f->chunk_cat_bf16_to_f32 : f->chunk_cat_f16_to_f32;
    widen_stream_ = bf16 ? f->chunk_cat_bf16_to_f32_stream : f->chunk_cat_f16_to_f32_stream;
  }
  return true;
}

int64_t ChunkCatKernel::write(const ChunkCatLayout& l, int64_t lo, int64_t hi, bool stream) const {
  const int64_t oes = oes_;
  if (cast_) {
    (stream ? widen_stream_ : widen_)(l, lo, hi);
  } else if (stream) {
    chunk_cat_range(l, oes, oes, lo, hi, [oes](char* d, const char* s, int64_t n) { stream_copy(d, s, n * oes); });
  } else {
    chunk_cat_range(l, oes, oes, lo, hi, [oes](char* d, const char* s, int64_t n) { std::memcpy(d, s, n * oes); });
  }
  return stream ? (hi - lo) * oes : 0;
}

int64_t ChunkCatKernel::pass(const ChunkCatLayout& layout, int64_t out_numel, int64_t moved_bytes) const {
  // A variant without streaming stores stores normally.
  return split_pass(out_numel, oes_, moved_bytes, /*can_stream=*/!cast_ || widen_stream_ != nullptr,
                    [&](int64_t lo, int64_t hi, bool stream) { return write(layout, lo, hi, stream); });
}

}  // namespace npu_dispatch
