// Counters for calls that C++ runs with no Python around them: the kernels of the npu_dispatch
// ops (compiled code, the public wrappers), the direct entry, and the interception kernels of an
// entered NpuFastCopyMode (dispatch/intercept.h). Python drains them into a CopyStats when it reads one
// (npu_dispatch.stats).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace npu_dispatch {

// The ops C++ counts: the npu_dispatch ops, then the stock ops an entered NpuFastCopyMode
// intercepts. Python sees them by name (kCountedOpNames, binding/to_python.cpp).
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
inline constexpr const char* kCountedOpNames[] = {
    "npu_dispatch.foreach_copy_", "npu_dispatch.all_gather_copy_in", "aten._foreach_copy_", "aten._foreach_copy",
    "fsdp.all_gather_copy_in", "npu_dispatch.split_with_sizes_copy", "npu_dispatch.chunk_cat",
    "fsdp.split_with_sizes_copy", "fsdp.chunk_cat", "fsdp.chunk_cat_mixed_dtype",
};
static_assert(sizeof(kCountedOpNames) / sizeof(kCountedOpNames[0]) == kNumCountedOps, "a name per op");

// One counted op's block in a drained vector (OpStats::drain), the one place its layout is known:
// (calls, fast_calls, fallback_calls, nanoseconds) at 0; at op_path_offset(p), path p's (calls,
// pairs, bytes, launches); at op_reason_offset(k), reason kind k's (pairs, calls).
int op_stats_len();
int op_path_offset(int path);
int op_reason_offset(int kind);

// One set of counters, safe to share between threads.
class OpStats {
 public:
  OpStats();
  // `counts`: the count vector of planner/execute.h for one executed call.
  void record(CountedOp op, const std::vector<int64_t>& counts, int64_t nanoseconds);
  // Per counted op, in order: (calls, fast_calls, fallback_calls, nanoseconds), then per path
  // (calls, pairs, bytes, launches), then per fallback reason (pairs, calls); then zeroed.
  // binding/to_python.cpp hands it to Python by name.
  std::vector<int64_t> drain();

 private:
  std::mutex mutex_;
  std::vector<int64_t> acc_;
};

// The counters of the direct ops called outside any mode (npu_dispatch.stats.global_stats).
// Calls made inside an entered mode count there instead: dispatch/mode_scope.h record_call.
void record_direct(CountedOp op, const std::vector<int64_t>& counts, int64_t nanoseconds);
std::vector<int64_t> drain_direct();

}  // namespace npu_dispatch
