#include "planner/spans.h"

#include <algorithm>

namespace npu_dispatch {

bool writes_overlap(std::vector<Span>& dsts, const std::vector<Span>& srcs, Span* dst_hull, Span* src_hull) {
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
  if (dst_hull != nullptr) *dst_hull = dh;
  if (src_hull != nullptr) *src_hull = sh;
  return meets(dsts, dh, srcs, sh);
}

bool meets(const std::vector<Span>& sorted, Span sorted_hull, const std::vector<Span>& spans, Span spans_hull) {
  const uintptr_t lo = sorted_hull.start;
  const uintptr_t hi = sorted_hull.end;
  if (sorted.empty() || spans.empty() || spans_hull.end <= lo || spans_hull.start >= hi) return false;
  // A cursor walks forward while the spans come in address order; a span before the last one
  // seeks it again by bisection.
  size_t k = 0;
  uintptr_t last = 0;
  for (const auto& s : spans) {
    // Spans outside the sorted ones' hull meet none (separate allocations made before or after
    // the destinations usually lie outside it).
    if (s.start >= hi || s.end <= lo) continue;
    if (s.start < last) {
      k = std::partition_point(sorted.begin(), sorted.end(), [&](const Span& x) { return x.end <= s.start; }) -
          sorted.begin();
    } else {
      while (k < sorted.size() && sorted[k].end <= s.start) ++k;
    }
    last = s.start;
    if (k < sorted.size() && sorted[k].start < s.end) return true;
  }
  return false;
}

}  // namespace npu_dispatch
