// The CPU pass of aten::_chunk_cat.out (FSDP2's reduce-scatter copy-in) over contiguous tensors:
// out, [pre, num_chunks, width], is the concatenation along each row of every tensor's chunk
// (its rows c*chunk .. c*chunk + chunk, widened to out's dtype) followed by that chunk's zero
// padding. One pass over out's elements, split across threads by out's bytes, computes each
// piece's addresses as it goes: no piece list is built before the bytes move.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <c10/macros/Macros.h>

#include "fsdp/chunk_cat_layout.h"

namespace npu_dispatch {

// Zeros over [d, d + n) bytes. A chunk's padding is under one row of its tensor (a few elements
// for a 1-D gradient), so short spans are written inline, by two fixed-size stores that may
// overlap, instead of by a call to memset each. Always inlined, with internal linkage: a
// conversion variant includes this header after its ISA switch, and an out-of-line copy built for
// one ISA must not serve another's callers.
static C10_ALWAYS_INLINE void zero_bytes(char* d, int64_t n) {
  static constexpr char kZeros[32] = {};
  const auto two = [d, n](auto width) {  // [d, d + width) and [d + n - width, d + n): all of it
    std::memcpy(d, kZeros, width);
    std::memcpy(d + n - width, kZeros, width);
  };
  if (n > 64) {
    std::memset(d, 0, n);
  } else if (n >= 32) {
    two(std::integral_constant<size_t, 32>());
  } else if (n >= 16) {
    two(std::integral_constant<size_t, 16>());
  } else if (n >= 8) {
    two(std::integral_constant<size_t, 8>());
  } else if (n >= 4) {
    two(std::integral_constant<size_t, 4>());
  } else if (n >= 2) {
    two(std::integral_constant<size_t, 2>());
  } else if (n == 1) {
    *d = 0;
  }
}

// out's elements [lo, hi), row by row: copy(dst, src, n) for each run of n data elements (element
// sizes ies / oes), zeros for each run of padding. (Row by row writes out front to back; tensor by
// tensor would write num_chunks rows at a time.) A
// template so that a conversion variant (cpu/convert_impl.h) inlines its loop into the pass: each
// instance is that variant's own (its Copy type is). The layout's structs (and their implicit
// members) come from fsdp/chunk_cat_layout.h, which cpu/convert_prelude.h includes before any ISA
// switch, so no code built for one ISA can serve another's callers.
template <typename Copy>
void chunk_cat_range(const ChunkCatLayout& l, int64_t ies, int64_t oes, int64_t lo, int64_t hi, const Copy& copy) {
  if (lo >= hi) return;
  const ChunkSource* const first = l.sources.data();
  const ChunkSource* const last = first + l.sources.size();
  // Fields in locals: the copies write through char pointers, which may alias the layout.
  char* const out = l.out;
  const int64_t width = l.width, num_chunks = l.num_chunks;
  int64_t r = lo / width;
  // The last region starting at or before lo's position in its row.
  // (A layout of some of a call's inputs, one pass per input dtype, may leave gaps: lo can come
  // before the first region, and then the pass starts at it.)
  const ChunkSource* t = std::max(
      first,
      std::upper_bound(first, last, lo - r * width, [](int64_t v, const ChunkSource& x) { return v < x.offset; }) - 1);
  for (;; ++r, t = first) {
    const int64_t row = r * width;
    if (row >= hi) return;
    const int64_t p = r / num_chunks, c = r - p * num_chunks;
    for (; t != last; ++t) {
      const int64_t seg = row + t->offset, len = t->chunk_numel;
      const int64_t valid = std::clamp<int64_t>(t->slice_numel - c * len, 0, len);
      const char* const src = t->data + (p * t->slice_numel + c * len) * ies;
      // The data run [a, b) and the padding run [za, zb), clipped to [lo, hi) only for the two
      // regions at its ends; one copy call site, so that the copy's loop is inlined once.
      int64_t a = seg, b = seg + valid, za = b, zb = seg + len;
      if (seg < lo || zb > hi) {
        if (seg >= hi) return;
        a = std::max(lo, a), b = std::min(hi, b), za = std::max(lo, za), zb = std::min(hi, zb);
      }
      if (a < b) copy(out + a * oes, src + (a - seg) * ies, b - a);
      // Stock pads with zeros of the input dtype before its cast: +0 is all-zero bits.
      if (za < zb) zero_bytes(out + za * oes, (zb - za) * oes);
    }
  }
}

}  // namespace npu_dispatch
