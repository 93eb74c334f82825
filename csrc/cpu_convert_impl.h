// Body of one conversion variant; included by cpu_convert_<capability>.cpp after it has chosen
// CPU_CAPABILITY and the target ISA. Every element, tails included, goes through the same
// Vectorized conversion, as in ATen's reduced_float_copy_kernel, so chunk boundaries never show.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>

#include "cpu_convert.h"

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
  if (i < n) {
    const int64_t rem = n - i;
    const int64_t fs = fVec::size();
    const auto a = fVec::loadu(src + i, std::min(rem, fs));
    const auto b = fVec::loadu(src + i + fs, std::max<int64_t>(rem - fs, 0));
    at::vec::convert_from_float<R>(a, b).store(dst + i, rem);
  }
}

template <typename R>
void to_float(const uint16_t* src_bits, float* dst, int64_t n) {
  using fVec = Vectorized<float>;
  using rVec = Vectorized<R>;
  const R* src = reinterpret_cast<const R*>(src_bits);
  int64_t i = 0;
  for (; i + rVec::size() <= n; i += rVec::size()) {
    const auto [a, b] = at::vec::convert_to_float<R>(rVec::loadu(src + i));
    a.store(dst + i);
    b.store(dst + i + fVec::size());
  }
  if (i < n) {
    const int64_t rem = n - i;
    const int64_t fs = fVec::size();
    const auto [a, b] = at::vec::convert_to_float<R>(rVec::loadu(src + i, rem));
    a.store(dst + i, std::min(rem, fs));
    b.store(dst + i + fs, std::max<int64_t>(rem - fs, 0));
  }
}

const ConvertFns* fns() {
  static const ConvertFns f{
      NPU_DISPATCH_VARIANT_NAME,
      &from_float<c10::BFloat16>,
      &to_float<c10::BFloat16>,
      &from_float<c10::Half>,
      &to_float<c10::Half>,
  };
  return &f;
}

}  // namespace CPU_CAPABILITY
}  // namespace npu_dispatch
