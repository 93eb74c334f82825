// The one overlap rule of the library: a copy may run on the fast path only where no destination's
// bytes meet another destination's or any source's (sources may share memory with each other: they
// are only read). Stock's _foreach_copy_ copies pair by pair, so an overlap makes its result depend
// on the order. The planner (planner/plan.cpp), the one-pass plan (planner/one_pass.cpp) and the
// copy-out (fsdp/copies.cpp) ask writes_overlap(); chunk_cat, with one destination, asks
// spans_meet() of each input. The planner's sweep (first_overlap) only names the pair stock
// meets first, once writes_overlap() has found one (on one device).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace npu_dispatch {

// The bytes [start, end) a tensor's elements may occupy.
struct Span {
  uintptr_t start, end;
};

// [data, data + numel * element_size): the bytes of a contiguous tensor.
inline Span contiguous_span(const at::Tensor& t) {
  const auto p = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  return {p, p + static_cast<uintptr_t>(t.numel() * t.element_size())};
}

// Whether two spans share a byte.
inline bool spans_meet(Span a, Span b) { return a.start < b.end && b.start < a.end; }

// Whether any destination span meets another destination span or any source span. Sorts `dsts`
// by start (they usually arrive in address order, and the sort is then skipped); sources are read
// in any order. Empty destinations: false.
bool writes_overlap(std::vector<Span>& dsts, const std::vector<Span>& srcs);

}  // namespace npu_dispatch
