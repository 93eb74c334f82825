// The CPU pass of aten::split_with_sizes_copy.out (FSDP2's all-gather copy-out) over contiguous
// tensors: src is [rows, row_bytes] bytes, and each row is every out's piece of that row side by
// side, out i's row r at out i's data + r * its piece's bytes. Every byte of src goes to exactly
// one out, so the pass splits src's bytes across threads and computes each piece's addresses as
// it goes: no piece list is built before the bytes move.
#pragma once

#include <cstdint>
#include <vector>

namespace npu_dispatch {

// One out in the layout: its row's `bytes` (> 0) start at byte `offset` of each src row.
struct CopyOutPiece {
  char* dst;
  int64_t bytes, offset;
};

struct CopyOutLayout {
  const char* src;
  int64_t rows = 0, row_bytes = 0;
  std::vector<CopyOutPiece> pieces;  // offsets strictly increasing; their bytes sum to row_bytes

  // Appends out `dst`'s piece of `bytes` (> 0) at the end of the row built so far. In a layout of
  // one row, a piece that continues the last one in both src and dst extends it.
  void add(char* dst, int64_t bytes);
};

// Copies src's bytes [lo, hi) (of rows * row_bytes) to their outs, with streaming stores where
// `stream` (unfenced); returns the bytes streamed.
int64_t copy_out_range(const CopyOutLayout& layout, int64_t lo, int64_t hi, bool stream);

// The whole pass, one byte_pass (cpu/byte_pass.h) over src's bytes; counted in the kernel's
// counters as one item a piece of a row.
void copy_out_pass(const CopyOutLayout& layout);

}  // namespace npu_dispatch
