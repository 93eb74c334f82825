// The copy-out's CPU pass (fsdp/copy_out_kernel.h).
#include "fsdp/copy_out_kernel.h"

#include <algorithm>

#include "cpu/byte_copy.h"
#include "cpu/byte_pass.h"
#include "cpu/copy_kernel.h"

namespace npu_dispatch {

void CopyOutLayout::add(char* dst, int64_t bytes) {
  if (rows == 1 && !pieces.empty() && pieces.back().dst + pieces.back().bytes == dst) {
    pieces.back().bytes += bytes;
  } else {
    pieces.push_back({dst, bytes, row_bytes});
  }
  row_bytes += bytes;
}

namespace {

// src's bytes [lo, hi), row by row: copy(dst, src, n) for each piece, clipped to [lo, hi) only at
// the range's two ends; with `backward`, last piece first (each piece still front to back).
template <typename Copy>
void walk(const CopyOutLayout& l, int64_t lo, int64_t hi, bool backward, const Copy& copy) {
  if (lo >= hi) return;
  const CopyOutPiece* const first = l.pieces.data();
  const CopyOutPiece* const last = first + l.pieces.size();
  // Fields in locals: the copies write through char pointers, which may alias the layout.
  const char* const src = l.src;
  const int64_t row_bytes = l.row_bytes;
  // The piece holding src byte x, in x's row r.
  const auto at = [&](int64_t x, int64_t r) {
    return std::upper_bound(first, last, x - r * row_bytes,
                            [](int64_t v, const CopyOutPiece& q) { return v < q.offset; }) - 1;
  };
  // One piece of row r, clipped to [lo, hi); false once past the range's end in the walk's
  // direction.
  const auto one = [&](const CopyOutPiece* p, int64_t r) {
    const int64_t seg = r * row_bytes + p->offset;
    int64_t a = seg, b = seg + p->bytes;
    if (a < lo || b > hi) {
      if (a >= hi || b <= lo) return false;
      a = std::max(lo, a), b = std::min(hi, b);
    }
    copy(p->dst + r * p->bytes + (a - seg), src + a, b - a);
    return true;
  };
  if (!backward) {
    int64_t r = lo / row_bytes;
    for (const CopyOutPiece* p = at(lo, r);; ++r, p = first) {
      for (; p != last; ++p) {
        if (!one(p, r)) return;
      }
    }
  }
  int64_t r = (hi - 1) / row_bytes;
  for (const CopyOutPiece* p = at(hi - 1, r);; --r, p = last - 1) {
    for (;; --p) {
      if (!one(p, r)) return;
      if (p == first) break;
    }
  }
}

}  // namespace

int64_t copy_out_range(const CopyOutLayout& l, int64_t lo, int64_t hi, bool stream) {
  const bool backward = CpuCopyBatch::alternate();
  if (stream) {
    walk(l, lo, hi, backward, [](char* d, const char* s, int64_t n) { stream_copy(d, s, n); });
    return hi - lo;
  }
  walk(l, lo, hi, backward, [](char* d, const char* s, int64_t n) { byte_copy(d, s, n); });
  return 0;
}

void copy_out_pass(const CopyOutLayout& l) {
  const int64_t total = l.rows * l.row_bytes;
  byte_pass(total, 1, 2 * total, l.rows * static_cast<int64_t>(l.pieces.size()), /*can_stream=*/true,
            [&l](int64_t b, int64_t e, bool stream) { return copy_out_range(l, b, e, stream); });
}

}  // namespace npu_dispatch
