// Counters for calls that C++ runs with no Python around them: the kernels of the npu_dispatch
// ops (compiled code, the public wrappers), the direct entry, and the interception kernels of an
// entered NpuFastCopyMode (intercept.h). Python drains them into a CopyStats when it reads one
// (npu_dispatch.stats).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace npu_dispatch {

// The ops C++ counts, in the order of npu_dispatch/_native.py _COUNTED_OPS: the npu_dispatch ops,
// then the stock ops an entered NpuFastCopyMode intercepts.
enum CountedOp : int {
  kOpForeachCopy = 0,
  kOpAllGatherCopyIn,
  kOpAtenForeachCopy,
  kOpAtenForeachCopyFunctional,
  kOpFsdpAllGatherCopyIn,
  kOpSplitWithSizesCopy,
  kOpChunkCat,
  kOpFsdpSplitWithSizesCopy,
  kOpFsdpChunkCat,
  kOpFsdpChunkCatMixedDtype,
  kNumCountedOps
};

// The length of one counted op's block in a drained vector (OpStats::drain).
int op_stats_len();

// One set of counters, safe to share between threads.
class OpStats {
 public:
  OpStats();
  // `counts`: the count vector of execute.h for one executed call.
  void record(CountedOp op, const std::vector<int64_t>& counts, int64_t nanoseconds);
  // Per counted op, in order: (calls, fast_calls, fallback_calls, nanoseconds), then per path
  // (calls, pairs, bytes, launches), then per fallback reason (pairs, calls); then zeroed.
  // npu_dispatch/_native.py fold_counters reads it.
  std::vector<int64_t> drain();

 private:
  std::mutex mutex_;
  std::vector<int64_t> acc_;
};

// The counters of the direct ops called outside any mode (npu_dispatch.stats.global_stats).
// Calls made inside an entered mode count there instead: mode_scope.h record_call.
void record_direct(CountedOp op, const std::vector<int64_t>& counts, int64_t nanoseconds);
std::vector<int64_t> drain_direct();

}  // namespace npu_dispatch
