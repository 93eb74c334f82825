#include "dispatch/native_stats.h"

namespace npu_dispatch {
namespace {

OpStats& direct_stats() {
  static OpStats* s = new OpStats();  // never destroyed: kernels may run during exit
  return *s;
}

}  // namespace

void OpTotals::add(const CallResult& r, int64_t ns) {
  calls += 1;
  nanoseconds += ns;
  for (int p = 0; p < kNumPaths; ++p) {
    const PathCounts& c = r.paths[p];
    if (c.tensors == 0) continue;
    paths[p].calls += 1;
    paths[p].counts.add(c.tensors, c.bytes, c.launches);
  }
  fast_calls += r.fast() ? 1 : 0;
  fallback_calls += r.fallback() ? 1 : 0;
  for (int k = 0; k < kNumKinds; ++k) {
    reasons[k].pairs += r.reasons[k];
    reasons[k].calls += r.reasons[k] != 0 ? 1 : 0;
  }
}

void OpStats::record(CountedOp op, const CallResult& r, int64_t nanoseconds) {
  std::lock_guard<std::mutex> g(mutex_);
  acc_[op].add(r, nanoseconds);
}

StatsTotals OpStats::drain() {
  std::lock_guard<std::mutex> g(mutex_);
  StatsTotals out{};
  out.swap(acc_);
  return out;
}

void record_direct(CountedOp op, const CallResult& r, int64_t nanoseconds) {
  direct_stats().record(op, r, nanoseconds);
}

StatsTotals drain_direct() { return direct_stats().drain(); }

}  // namespace npu_dispatch
