// Dtype conversion loops built once per CPU capability from ATen's own vectorized conversions,
// so each element gets exactly the bits stock's copy kernel gives it under that capability.
#pragma once

#include <cstdint>

namespace npu_dispatch {

struct ConvertFns {
  const char* name;
  void (*f32_to_bf16)(const float* src, uint16_t* dst, int64_t n);
  void (*bf16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  void (*f32_to_f16)(const float* src, uint16_t* dst, int64_t n);
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n);
};

// nullptr where this build or this CPU cannot run the variant.
const ConvertFns* convert_fns_default();
const ConvertFns* convert_fns_avx2();
const ConvertFns* convert_fns_avx512();

}  // namespace npu_dispatch
