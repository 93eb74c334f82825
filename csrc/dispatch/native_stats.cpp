#include "dispatch/native_stats.h"

#include "planner/execute.h"

namespace npu_dispatch {
namespace {

constexpr int kOpHead = 4, kPerPath = 4, kPerKind = 2;
constexpr int kOpLen = kOpHead + kNumPaths * kPerPath + kNumKinds * kPerKind;
constexpr int kLen = kNumCountedOps * kOpLen;

OpStats& direct_stats() {
  static OpStats* s = new OpStats();  // never destroyed: kernels may run during exit
  return *s;
}

}  // namespace

int op_stats_len() { return kOpLen; }
int op_path_offset(int path) { return kOpHead + kPerPath * path; }
int op_reason_offset(int kind) { return kOpHead + kPerPath * kNumPaths + kPerKind * kind; }

OpStats::OpStats() : acc_(kLen, 0) {}

void OpStats::record(CountedOp op, const std::vector<int64_t>& v, int64_t nanoseconds) {
  std::lock_guard<std::mutex> g(mutex_);
  int64_t* o = acc_.data() + op * kOpLen;
  o[0] += 1;
  const auto used = [&](Path p) { return v[path_slot(p, 0)] != 0; };
  bool fast = false, off = false;
  for (int p = 0; p < kNumPaths; ++p) {
    fast = fast || (kFastPath[p] && used(static_cast<Path>(p)));
    off = off || (kOffFastPath[p] && used(static_cast<Path>(p)));
  }
  o[1] += fast ? 1 : 0;
  o[2] += off ? 1 : 0;
  o[3] += nanoseconds;
  for (int p = 0; p < kNumPaths; ++p) {
    if (!used(static_cast<Path>(p))) continue;
    int64_t* row = o + op_path_offset(p);
    row[0] += 1;
    for (int f = 0; f < 3; ++f) row[1 + f] += v[path_slot(static_cast<Path>(p), f)];
  }
  for (int k = 0; k < kNumKinds; ++k) {
    const int64_t pairs = v[reason_slot(static_cast<Kind>(k))];
    int64_t* row = o + op_reason_offset(k);
    row[0] += pairs;
    row[1] += pairs != 0 ? 1 : 0;
  }
}

std::vector<int64_t> OpStats::drain() {
  std::lock_guard<std::mutex> g(mutex_);
  std::vector<int64_t> out(kLen, 0);
  out.swap(acc_);
  return out;
}

void record_direct(CountedOp op, const std::vector<int64_t>& counts, int64_t nanoseconds) {
  direct_stats().record(op, counts, nanoseconds);
}

std::vector<int64_t> drain_direct() { return direct_stats().drain(); }

}  // namespace npu_dispatch
