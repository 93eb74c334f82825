// ATen's AVX512 capability (vec512): the flags ATen builds it with, for this TU only.
#define CPU_CAPABILITY npu_dispatch_avx512
#define NPU_DISPATCH_VARIANT_NAME "AVX512"
#include "cpu/convert_prelude.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define NPU_DISPATCH_HAVE_AVX512 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2,f16c")
// The target pragma leaves the ISA macros alone; sleef.h declares its vector functions by them.
#pragma push_macro("__AVX__")
#undef __AVX__
#define __AVX__ 1
#pragma push_macro("__AVX2__")
#undef __AVX2__
#define __AVX2__ 1
#pragma push_macro("__FMA__")
#undef __FMA__
#define __FMA__ 1
#pragma push_macro("__F16C__")
#undef __F16C__
#define __F16C__ 1
#pragma push_macro("__AVX512F__")
#undef __AVX512F__
#define __AVX512F__ 1
#pragma push_macro("__AVX512BW__")
#undef __AVX512BW__
#define __AVX512BW__ 1
#pragma push_macro("__AVX512VL__")
#undef __AVX512VL__
#define __AVX512VL__ 1
#pragma push_macro("__AVX512DQ__")
#undef __AVX512DQ__
#define __AVX512DQ__ 1
#define CPU_CAPABILITY_AVX512
#include "cpu/convert_impl.h"
#pragma pop_macro("__AVX__")
#pragma pop_macro("__AVX2__")
#pragma pop_macro("__FMA__")
#pragma pop_macro("__F16C__")
#pragma pop_macro("__AVX512F__")
#pragma pop_macro("__AVX512BW__")
#pragma pop_macro("__AVX512VL__")
#pragma pop_macro("__AVX512DQ__")
#pragma GCC pop_options
#endif

namespace npu_dispatch {
const ConvertFns* convert_fns_avx512() {
#ifdef NPU_DISPATCH_HAVE_AVX512
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return npu_dispatch_avx512::fns();
  }
#endif
  return nullptr;
}
}  // namespace npu_dispatch
