// ATen's AVX2 capability (vec256), with the ISA switched on for this TU only.
#define CPU_CAPABILITY npu_dispatch_avx2
#define NPU_DISPATCH_VARIANT_NAME "AVX2"
#include "cpu/convert_prelude.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define NPU_DISPATCH_HAVE_AVX2 1
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
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
#define CPU_CAPABILITY_AVX2
#include "cpu/convert_impl.h"
#pragma pop_macro("__AVX__")
#pragma pop_macro("__AVX2__")
#pragma pop_macro("__FMA__")
#pragma pop_macro("__F16C__")
#pragma GCC pop_options
#endif

namespace npu_dispatch {
const ConvertFns* convert_fns_avx2() {
#ifdef NPU_DISPATCH_HAVE_AVX2
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return npu_dispatch_avx2::fns();
  }
#endif
  return nullptr;
}
}  // namespace npu_dispatch
