// The layout chunk_cat's CPU pass reads (chunk_cat_kernel.h); apart from it so that
// cpu_convert_prelude.h includes it before a conversion variant switches on its ISA.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace npu_dispatch {

// One input of the layout: contiguous [pre, rows, post] at `data`; its region of each out row
// starts at element `offset` and is chunk * post elements (the chunk's rows that exist, then
// zeros).
struct ChunkSource {
  const char* data;
  int64_t rows, chunk, post, offset;
};

struct ChunkCatLayout {
  char* out;  // contiguous [pre, num_chunks, width] of out_dtype
  int64_t pre, num_chunks, width;
  c10::ScalarType in_dtype, out_dtype;
  std::vector<ChunkSource> sources;  // offsets strictly increasing, every region non-empty
};

// Writes out as stock's _chunk_cat writes it: the same bits where the dtype pair is one the CPU
// kernel reproduces in any split (a byte copy, or a widening cast it called mergeable); false,
// nothing written, otherwise. *pairs: the pieces with data (pre * sum of ceil(rows / chunk)).
bool run_chunk_cat(const ChunkCatLayout& layout, int64_t* pairs);

}  // namespace npu_dispatch
