// Counters for calls that C++ runs with no Python around them: the kernels of the npu_dispatch
// ops (compiled code, the public wrappers), the direct entry, and the interception kernels of an
// entered NpuFastCopyMode (dispatch/intercept.h). Python drains them into a CopyStats when it reads one
// (npu_dispatch.stats).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include "dispatch/op_table.h"
#include "planner/execute.h"

namespace npu_dispatch {

// One counted op's totals since the last drain.
struct OpTotals {
  int64_t calls = 0, fast_calls = 0, fallback_calls = 0, nanoseconds = 0;
  struct PathTotals {
    int64_t calls = 0;  // calls that used the path
    PathCounts counts;
  };
  std::array<PathTotals, kNumPaths> paths{};
  struct ReasonTotals {
    int64_t pairs = 0, calls = 0;
  };
  std::array<ReasonTotals, kNumKinds> reasons{};
  void add(const CallResult& r, int64_t ns);
};
using StatsTotals = std::array<OpTotals, kNumCountedOps>;

// One set of counters, safe to share between threads.
class OpStats {
 public:
  void record(CountedOp op, const CallResult& r, int64_t nanoseconds);
  // The totals since the last drain, per counted op; then zeroed.
  StatsTotals drain();

 private:
  std::mutex mutex_;
  StatsTotals acc_{};
};

// The counters of the direct ops called outside any mode (npu_dispatch.stats.global_stats).
// Calls made inside an entered mode count there instead: dispatch/mode_scope.h record_call.
void record_direct(CountedOp op, const CallResult& r, int64_t nanoseconds);
StatsTotals drain_direct();

}  // namespace npu_dispatch
