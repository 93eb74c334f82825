#include "planner/spans.h"

#include <algorithm>

namespace npu_dispatch {

bool writes_overlap(std::vector<Span>& dsts, const std::vector<Span>& srcs) {
  if (dsts.empty()) return false;
  auto by_start = [](const Span& a, const Span& b) { return a.start < b.start; };
  if (!std::is_sorted(dsts.begin(), dsts.end(), by_start)) std::sort(dsts.begin(), dsts.end(), by_start);
  for (size_t k = 1; k < dsts.size(); ++k) {
    if (dsts[k].start < dsts[k - 1].end) return true;
  }
  Span dh{dsts.front().start, dsts.back().end};
  for (const auto& d : dsts) dh.end = std::max(dh.end, d.end);
  Span sh{0, 0};
  if (!srcs.empty()) {
    sh = srcs.front();
    for (const auto& s : srcs) {
      sh.start = std::min(sh.start, s.start);
      sh.end = std::max(sh.end, s.end);
    }
  }
  // Whether a source meets a destination (sorted, pairwise disjoint, within the hull `dh`).
  // Disjoint hulls answer without reading either list.
  const uintptr_t lo = dh.start;
  const uintptr_t hi = dh.end;
  if (srcs.empty() || sh.end <= lo || sh.start >= hi) return false;
  // A cursor walks forward while the spans come in address order; a span before the last one
  // seeks it again by bisection.
  size_t k = 0;
  uintptr_t last = 0;
  for (const auto& s : srcs) {
    // Spans outside the destinations' hull meet none (separate allocations made before or after
    // the destinations usually lie outside it).
    if (s.start >= hi || s.end <= lo) continue;
    if (s.start < last) {
      k = std::partition_point(dsts.begin(), dsts.end(), [&](const Span& x) { return x.end <= s.start; }) -
          dsts.begin();
    } else {
      while (k < dsts.size() && dsts[k].end <= s.start) ++k;
    }
    last = s.start;
    if (k < dsts.size() && dsts[k].start < s.end) return true;
  }
  return false;
}

}  // namespace npu_dispatch
