// Counters for calls that C++ runs with no Python around them: the kernels of
// npu_dispatch::foreach_copy_ and all_gather_copy_in (compiled code, the public wrappers), the
// direct entry, and NpuFastCopyMode's dispatch route (mode_route.h). Python drains them into a
// CopyStats when it reads one (npu_dispatch.stats).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace npu_dispatch {

// kOpAtenForeachCopy is what the mode route counts (aten._foreach_copy_ under the mode).
enum DirectOp : int { kOpForeachCopy = 0, kOpAllGatherCopyIn, kOpAtenForeachCopy, kNumDirectOps };

// One set of counters, safe to share between threads.
class OpStats {
 public:
  OpStats();
  // `counts`: the count vector of execute.h for one executed call.
  void record(DirectOp op, const std::vector<int64_t>& counts, int64_t nanoseconds);
  // [kNumDirectOps x (calls, fast_calls, fallback_calls, nanoseconds)]
  // [kNumPaths x (calls, tensors, bytes, launches)] [kNumKinds reason counts]; then zeroed.
  std::vector<int64_t> drain();

 private:
  std::mutex mutex_;
  std::vector<int64_t> acc_;
};

// The counters of the direct ops called outside any mode (npu_dispatch.stats.global_stats).
void record_direct(DirectOp op, const std::vector<int64_t>& counts, int64_t nanoseconds);
std::vector<int64_t> drain_direct();

}  // namespace npu_dispatch
