// Counters for calls that reach the C++ kernels of npu_dispatch::foreach_copy_ and
// all_gather_copy_in directly (compiled code, the public wrappers): no Python runs there, so
// npu_dispatch.stats.global_stats() drains these into the Python counters when read.
#pragma once

#include <cstdint>
#include <vector>

namespace npu_dispatch {

enum DirectOp : int { kOpForeachCopy = 0, kOpAllGatherCopyIn, kNumDirectOps };

void record_direct(DirectOp op, const std::vector<int64_t>& counts, int64_t nanoseconds);

// [kNumDirectOps x (calls, fast_calls, fallback_calls, nanoseconds)]
// [kNumPaths x (calls, tensors, bytes, launches)] [kNumKinds reason counts]; then zeroed.
std::vector<int64_t> drain_direct();

}  // namespace npu_dispatch
