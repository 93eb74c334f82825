// Body of one conversion variant; included by cpu/convert_<capability>.cpp after it has chosen
// CPU_CAPABILITY and the target ISA. Every element, tails included, goes through the same
// Vectorized conversion, as in ATen's reduced_float_copy_kernel, so chunk boundaries never show.
// A run's dst must not overlap its src (the planner and the fsdp copies refuse aliasing): a tail
// rewrites the run's last full vector.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <type_traits>

#include "fsdp/chunk_cat_kernel.h"
#include "cpu/convert.h"

namespace npu_dispatch {
namespace CPU_CAPABILITY {

using at::vec::Vectorized;

template <typename R>
void from_float(const float* src, uint16_t* dst_bits, int64_t n) {
  using fVec = Vectorized<float>;
  using rVec = Vectorized<R>;
  R* dst = reinterpret_cast<R*>(dst_bits);
  int64_t i = 0;
  for (; i + rVec::size() <= n; i += rVec::size()) {
    const auto a = fVec::loadu(src + i);
    const auto b = fVec::loadu(src + i + fVec::size());
    at::vec::convert_from_float<R>(a, b).store(dst + i);
  }
  if (i < n && n >= rVec::size()) {
    // The last full vector once more, over elements the loop already wrote with these same bits:
    // no masked tail (a piece of a few vectors pays most of its time there).
    i = n - rVec::size();
    const auto a = fVec::loadu(src + i);
    const auto b = fVec::loadu(src + i + fVec::size());
    at::vec::convert_from_float<R>(a, b).store(dst + i);
  } else if (i < n) {
    const int64_t rem = n - i;
    const int64_t fs = fVec::size();
    const auto a = fVec::loadu(src + i, std::min(rem, fs));
    const auto b = fVec::loadu(src + i + fs, std::max<int64_t>(rem - fs, 0));
    at::vec::convert_from_float<R>(a, b).store(dst + i, rem);
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// 16 elements of R widened by ATen's own AVX-512 conversion (the one Vectorized<R>'s
// convert_to_float applies to each half of a vector): the same bits.
template <typename R>
C10_ALWAYS_INLINE __m512 widen16(__m256i v) {
  __m512 o;
  if constexpr (std::is_same_v<R, c10::BFloat16>) {
    at::vec::cvtbf16_fp32(v, o);
  } else {
    at::vec::cvtfp16_fp32(v, o);
  }
  return o;
}

// to_float for a run of at least one vector, its stores on dst's 64-byte lines: the first
// vector at dst, then whole lines from the first line boundary, then the last vector once more
// (elements already written get the same bits). A store across two lines pays for both, and
// most of a short run's stores cross one where dst is not on a line (chunk_cat's runs, views of a
// flat buffer). Masked loads and stores gain nothing there; the shorter runs stay on to_float's
// general loop.
template <typename R>
C10_ALWAYS_INLINE bool to_float_lines(const uint16_t* src, float* dst, int64_t n) {
  constexpr int64_t kOnePass = 16;  // floats in a vector and in a line
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  if (n < kOnePass || d % sizeof(float) != 0) return false;
  const auto at = [src](int64_t i) {
    return widen16<R>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  };
  _mm512_storeu_ps(dst, at(0));
  const auto head = static_cast<int64_t>((kOnePass - (d / sizeof(float)) % kOnePass) % kOnePass);
  int64_t i = head == 0 ? kOnePass : head;
  for (; i + kOnePass <= n; i += kOnePass) _mm512_store_ps(dst + i, at(i));
  if (i < n) _mm512_storeu_ps(dst + n - kOnePass, at(n - kOnePass));
  return true;
}
#endif

// Always inlined where it is called (chunk_cat's pass calls it once per chunk of each gradient);
// its address is still taken for the fns() table.
template <typename R>
C10_ALWAYS_INLINE void to_float(const uint16_t* src_bits, float* dst, int64_t n) {
#if defined(CPU_CAPABILITY_AVX512)
  if (to_float_lines<R>(src_bits, dst, n)) return;
#endif
  using fVec = Vectorized<float>;
  using rVec = Vectorized<R>;
  const R* src = reinterpret_cast<const R*>(src_bits);
  int64_t i = 0;
  for (; i + rVec::size() <= n; i += rVec::size()) {
    const auto [a, b] = at::vec::convert_to_float<R>(rVec::loadu(src + i));
    a.store(dst + i);
    b.store(dst + i + fVec::size());
  }
  if (i < n && n >= rVec::size()) {
    i = n - rVec::size();  // as from_float's tail
    const auto [a, b] = at::vec::convert_to_float<R>(rVec::loadu(src + i));
    a.store(dst + i);
    b.store(dst + i + fVec::size());
  } else if (i < n) {
    const int64_t rem = n - i;
    const int64_t fs = fVec::size();
    const auto [a, b] = at::vec::convert_to_float<R>(rVec::loadu(src + i, rem));
    a.store(dst + i, std::min(rem, fs));
    b.store(dst + i + fs, std::max<int64_t>(rem - fs, 0));
  }
}

template <typename R>
void chunk_cat_to_float(const ChunkCatLayout& l, int64_t lo, int64_t hi) {
  chunk_cat_range(l, 2, 4, lo, hi, [](char* d, const char* s, int64_t n) {
    to_float<R>(reinterpret_cast<const uint16_t*>(s), reinterpret_cast<float*>(d), n);
  });
}

// to_float with streaming stores for the vectors that start on a vector's alignment in dst (the
// elements before and after through to_float): the same conversion, so the same bits. A pass far
// beyond the cache writes each line without reading it first (cpu/byte_copy.h). The caller fences.
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
template <typename R>
void to_float_stream(const uint16_t* src_bits, float* dst, int64_t n) {
  using fVec = Vectorized<float>;
  using rVec = Vectorized<R>;
  constexpr uintptr_t kAlign = fVec::size() * sizeof(float);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(dst);
  const int64_t head = static_cast<int64_t>(((kAlign - addr % kAlign) % kAlign) / sizeof(float));
  if (addr % sizeof(float) != 0 || n < head + rVec::size()) {
    to_float<R>(src_bits, dst, n);
    return;
  }
  if (head > 0) to_float<R>(src_bits, dst, head);
  const R* src = reinterpret_cast<const R*>(src_bits);
  int64_t i = head;
  for (; i + rVec::size() <= n; i += rVec::size()) {
    const auto [a, b] = at::vec::convert_to_float<R>(rVec::loadu(src + i));
#if defined(CPU_CAPABILITY_AVX512)
    _mm512_stream_ps(dst + i, a);
    _mm512_stream_ps(dst + i + fVec::size(), b);
#else
    _mm256_stream_ps(dst + i, a);
    _mm256_stream_ps(dst + i + fVec::size(), b);
#endif
  }
  if (i < n) to_float<R>(src_bits + i, dst + i, n - i);
}

template <typename R>
void chunk_cat_to_float_stream(const ChunkCatLayout& l, int64_t lo, int64_t hi) {
  chunk_cat_range(l, 2, 4, lo, hi, [](char* d, const char* s, int64_t n) {
    to_float_stream<R>(reinterpret_cast<const uint16_t*>(s), reinterpret_cast<float*>(d), n);
  });
}
#endif

const ConvertFns* fns() {
  static const ConvertFns f{
      NPU_DISPATCH_VARIANT_NAME,
      &from_float<c10::BFloat16>,
      &to_float<c10::BFloat16>,
      &from_float<c10::Half>,
      &to_float<c10::Half>,
      &chunk_cat_to_float<c10::BFloat16>,
      &chunk_cat_to_float<c10::Half>,
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
      &chunk_cat_to_float_stream<c10::BFloat16>,
      &chunk_cat_to_float_stream<c10::Half>,
#else
      nullptr,  // no streaming stores in this variant: the pass stores normally
      nullptr,
#endif
  };
  return &f;
}

}  // namespace CPU_CAPABILITY
}  // namespace npu_dispatch
