// Dtype conversion loops built once per CPU capability from ATen's own vectorized conversions,
// so each element gets exactly the bits stock's copy kernel gives it under that capability.
#pragma once

#include <cstdint>

namespace npu_dispatch {

struct ChunkCatLayout;
// chunk_cat's pass over out's elements [lo, hi) (fsdp/chunk_cat_kernel.h), one variant's conversion
// loop inlined.
using ChunkCatPass = void (*)(const ChunkCatLayout& layout, int64_t lo, int64_t hi);

struct ConvertFns {
  const char* name;
  void (*f32_to_bf16)(const float* src, uint16_t* dst, int64_t n);
  void (*bf16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  void (*f32_to_f16)(const float* src, uint16_t* dst, int64_t n);
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  ChunkCatPass chunk_cat_bf16_to_f32;
  ChunkCatPass chunk_cat_f16_to_f32;
  // The same with streaming stores (a pass beyond the cache; the caller fences); nullptr in a
  // variant without them.
  ChunkCatPass chunk_cat_bf16_to_f32_stream;
  ChunkCatPass chunk_cat_f16_to_f32_stream;
};

// nullptr where this build or this CPU cannot run the variant.
const ConvertFns* convert_fns_default();
const ConvertFns* convert_fns_avx2();
const ConvertFns* convert_fns_avx512();

}  // namespace npu_dispatch
