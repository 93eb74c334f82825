// Byte copies between buffers at any relative alignment: the copy-out's pieces are rows of
// parameters at any element offset of the all-gather output, so source and destination rarely
// share their offset within a cache line. On such pieces of FSDP2's sizes a loop of unaligned
// loads and 32-byte-aligned stores beats glibc's memcpy.
#pragma once

#include <cstdint>

namespace npu_dispatch {

// Copies `n` bytes (no overlap): one unaligned 32-byte vector, then 32-byte stores aligned to
// `dst`, then the last vector again over bytes already written with the same bits (AVX2; memcpy
// on a CPU without it, and for n < 32).
void byte_copy(char* dst, const char* src, int64_t n);

}  // namespace npu_dispatch
