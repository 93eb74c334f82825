// The CPU pass of aten::_chunk_cat.out (FSDP2's reduce-scatter copy-in) over contiguous tensors:
// out, [pre, num_chunks, width], is the concatenation along each row of every tensor's chunk
// (its rows c*chunk .. c*chunk + chunk, widened to out's dtype) followed by that chunk's zero
// padding. One pass over out's elements, split across threads by out's bytes, computes each
// piece's addresses as it goes: no piece list (docs/notes/profile.md, "chunk_cat's pass").
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "chunk_cat_layout.h"

namespace npu_dispatch {

// out's elements [lo, hi), row by row: copy(dst, src, n) for each run of n data elements (element
// sizes ies / oes), zeros for each run of padding. (Row by row measured faster on the CI host than
// tensor by tensor, whose writes go to num_chunks rows at a time: docs/notes/profile.md.) A
// template so that a conversion variant (cpu_convert_impl.h) inlines its loop into the pass: each
// instance is that variant's own (its Copy type is). The layout's structs (and their implicit
// members) come from chunk_cat_layout.h, which cpu_convert_prelude.h includes before any ISA
// switch, so no code built for one ISA can serve another's callers.
template <typename Copy>
void chunk_cat_range(const ChunkCatLayout& l, int64_t ies, int64_t oes, int64_t lo, int64_t hi, const Copy& copy) {
  if (lo >= hi) return;
  const auto& s = l.sources;
  const int64_t n = static_cast<int64_t>(s.size());
  int64_t r = lo / l.width;
  // The last region starting at or before lo's position in its row.
  const int64_t pos = lo - r * l.width;
  int64_t i = std::upper_bound(s.begin(), s.end(), pos, [](int64_t v, const ChunkSource& t) { return v < t.offset; }) -
              s.begin() - 1;
  for (;; ++r, i = 0) {
    const int64_t row = r * l.width;
    if (row >= hi) return;
    const int64_t p = r / l.num_chunks, c = r - p * l.num_chunks;
    for (; i < n; ++i) {
      const ChunkSource& t = s[i];
      const int64_t seg = row + t.offset;
      if (seg >= hi) return;
      const int64_t valid = std::clamp<int64_t>(t.rows - c * t.chunk, 0, t.chunk) * t.post;
      const int64_t a = std::max(lo, seg), b = std::min(hi, seg + valid);
      if (a < b) copy(l.out + a * oes, t.data + ((p * t.rows + c * t.chunk) * t.post + (a - seg)) * ies, b - a);
      // Stock pads with zeros of the input dtype before its cast: +0 is all-zero bits.
      const int64_t za = std::max(lo, seg + valid), zb = std::min(hi, seg + t.chunk * t.post);
      if (za < zb) std::memset(l.out + za * oes, 0, (zb - za) * oes);
    }
  }
}

}  // namespace npu_dispatch
