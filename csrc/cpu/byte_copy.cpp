#include "cpu/byte_copy.h"

#include <cstring>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define NPU_DISPATCH_BYTE_COPY_X86 1
#endif

namespace npu_dispatch {

#ifdef NPU_DISPATCH_BYTE_COPY_X86
// In the AVX2 namespace, the only one whose functions may use 256-bit registers (the library is
// checked for that by tests/test_native.py); the function alone is compiled for AVX2.
namespace npu_dispatch_avx2 {
namespace {

__attribute__((target("avx2"))) void copy(char* dst, const char* src, int64_t n) {
  using V = __m256i;
  const V first = _mm256_loadu_si256(reinterpret_cast<const V*>(src));
  const V last = _mm256_loadu_si256(reinterpret_cast<const V*>(src + n - 32));
  _mm256_storeu_si256(reinterpret_cast<V*>(dst), first);
  // From the first 32-byte boundary of dst past its start: every store below is aligned.
  int64_t i = 32 - static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst) & 31);
  for (; i + 32 <= n; i += 32) {
    _mm256_store_si256(reinterpret_cast<V*>(dst + i), _mm256_loadu_si256(reinterpret_cast<const V*>(src + i)));
  }
  _mm256_storeu_si256(reinterpret_cast<V*>(dst + n - 32), last);
}

}  // namespace
}  // namespace npu_dispatch_avx2
#endif

void byte_copy(char* dst, const char* src, int64_t n) {
#ifdef NPU_DISPATCH_BYTE_COPY_X86
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && n >= 32) {
    npu_dispatch_avx2::copy(dst, src, n);
    return;
  }
#endif
  std::memcpy(dst, src, static_cast<size_t>(n));
}

}  // namespace npu_dispatch
