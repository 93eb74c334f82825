// The layout chunk_cat's CPU pass reads (fsdp/chunk_cat_kernel.h); apart from it so that
// cpu/convert_prelude.h includes it before a conversion variant switches on its ISA.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

#include "cpu/convert.h"  // ChunkCatPass

namespace npu_dispatch {

// One input of the layout: contiguous [pre, rows, post] at `data`, counted in elements of one
// [rows, post] slice (rows * post) and of one chunk of it (chunk * post); its region of each out
// row starts at element `offset` and is chunk_numel elements (the chunk's rows that exist, then
// zeros).
struct ChunkSource {
  const char* data;
  int64_t slice_numel, chunk_numel, offset;
};

struct ChunkCatLayout {
  char* out;  // contiguous [pre, num_chunks, width] of out_dtype
  int64_t pre, num_chunks, width;
  c10::ScalarType in_dtype, out_dtype;
  std::vector<ChunkSource> sources;  // offsets strictly increasing, every region non-empty; gaps
                                     // between regions (another pass's) are left unwritten
};

// The kernel that writes a layout's out as stock's _chunk_cat writes it: a byte copy, or the
// conversion variant's widening instance of the pass (fsdp/chunk_cat_kernel.h), with streaming stores
// where the bytes moved go past the cache. Any thread may write any split of out.
class ChunkCatKernel {
 public:
  // False where the CPU pass does not reproduce the pair's bits in every split: it writes a byte
  // copy or a widening cast (stock's cat rounds a narrowing one). `through_cat`: the inputs reach
  // out through cat's cast into strided slices (ATen's copy kernel; _chunk_cat.out), so fp16
  // widens as that kernel does; else through copy_ (a contiguous slice, chunk_cat_mixed_dtype's
  // .to()), where only a cast the conversion table calls mergeable (no FBGEMM split) is taken.
  bool init(c10::ScalarType in_dtype, c10::ScalarType out_dtype, bool through_cat);
  // One split_pass (cpu/byte_pass.h) over out's `out_numel` elements, moving `moved_bytes` (read
  // plus written). Returns the bytes streamed; the caller counts the call's passes once.
  int64_t pass(const ChunkCatLayout& layout, int64_t out_numel, int64_t moved_bytes) const;

 private:
  // out's elements [lo, hi); returns the bytes streamed (`stream`; unfenced).
  int64_t write(const ChunkCatLayout& layout, int64_t lo, int64_t hi, bool stream) const;

  ChunkCatPass widen_ = nullptr, widen_stream_ = nullptr;  // none for a byte copy
  int64_t oes_ = 0;
  bool cast_ = false;
};

}  // namespace npu_dispatch
