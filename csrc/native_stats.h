// Counters for calls that C++ runs with no Python around them: the kernels of
// npu_dispatch::foreach_copy_ and all_gather_copy_in (compiled code, the public wrappers), the
// direct entry, and NpuFastCopyMode's dispatch route (mode_route.h). Python drains them into a
// CopyStats when it reads one (npu_dispatch.stats).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace npu_dispatch {

// The ops C++ counts: the direct ops, and aten._foreach_copy_ as the mode's route takes it.
enum CountedOp : int { kOpForeachCopy = 0, kOpAllGatherCopyIn, kOpAtenForeachCopy, kNumCountedOps };

// One set of counters, safe to share between threads.
class OpStats {
 public:
  OpStats();
  // `counts`: the count vector of execute.h for one executed call.
  void record(CountedOp op, const std::vector<int64_t>& counts, int64_t nanoseconds);
  // [kNumCountedOps x (calls, fast_calls, fallback_calls, nanoseconds)]
  // [kNumPaths x (calls, tensors, bytes, launches)] [kNumKinds reason counts]; then zeroed.
  std::vector<int64_t> drain();

 private:
  std::mutex mutex_;
  std::vector<int64_t> acc_;
};

// The counters of the direct ops called outside any mode (npu_dispatch.stats.global_stats).
void record_direct(CountedOp op, const std::vector<int64_t>& counts, int64_t nanoseconds);
std::vector<int64_t> drain_direct();

}  // namespace npu_dispatch
