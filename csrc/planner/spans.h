// The one overlap rule of the library: a copy may run on the fast path only where no destination's
// bytes meet another destination's or any source's (sources may share memory with each other: they
// are only read). Stock's _foreach_copy_ copies pair by pair, so an overlap makes its result depend
// on the order. The planner (planner/plan.cpp), the one-pass plan (planner/one_pass.cpp) and the
// copy-out (fsdp/copies.cpp) ask writes_overlap(); chunk_cat, with one destination, asks
// spans_meet() of each input. The planner asks writes_overlap() device by device; where it finds
// an overlap, a sweep (plan.cpp first_overlap) only names the overlapping pair.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace npu_dispatch {

// The bytes [start, end) a tensor's elements may occupy.
struct Span {
  uintptr_t start, end;
};

// numel * element_size: the bytes a tensor's elements hold, as every count of bytes counts them.
inline int64_t tensor_bytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }
inline int64_t total_bytes(at::TensorList ts) {
  int64_t b = 0;
  for (const auto& t : ts) b += tensor_bytes(t);
  return b;
}

// [data, data + tensor_bytes): the bytes of a contiguous tensor.
inline Span contiguous_span(const at::Tensor& t) {
  const auto p = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  return {p, p + static_cast<uintptr_t>(tensor_bytes(t))};
}

// Whether two spans share a byte.
inline bool spans_meet(Span a, Span b) { return a.start < b.end && b.start < a.end; }

// Whether any destination span meets another destination span or any source span. Sorts `dsts`
// by start (they usually arrive in address order, and the sort is then skipped); sources are read
// in any order. Empty destinations: false.
bool writes_overlap(std::vector<Span>& dsts, const std::vector<Span>& srcs);

}  // namespace npu_dispatch
