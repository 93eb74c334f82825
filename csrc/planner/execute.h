// Runs a plan and reports what it did (CallResult).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

#include "planner/plan.h"

namespace npu_dispatch {

// The paths a pair can take, in the order reports list them.
enum Path : int { kCoalesced = 0, kForeach, kFallback, kStock, kEmpty, kStaged, kNumPaths };
// Path's names, and which of them are the fast path (a call with a pair on one is a fast call) or
// off it (a fallback call).
inline constexpr const char* kPathNames[] = {"coalesced", "foreach", "fallback", "stock", "empty", "staged"};
inline constexpr bool kFastPath[] = {true, true, false, false, false, true};
inline constexpr bool kOffFastPath[] = {false, false, true, true, false, false};
static_assert(sizeof(kPathNames) / sizeof(kPathNames[0]) == kNumPaths, "a name per Path");
static_assert(sizeof(kFastPath) / sizeof(kFastPath[0]) == kNumPaths, "a flag per Path");
static_assert(sizeof(kOffFastPath) / sizeof(kOffFastPath[0]) == kNumPaths, "a flag per Path");

struct PathCounts {
  int64_t tensors = 0, bytes = 0, launches = 0;  // bytes: destination bytes written
  void add(int64_t t, int64_t b, int64_t l) {
    tensors += t;
    bytes += b;
    launches += l;
  }
};

// What one call did, as every entry returns it (binding/to_python.h hands it to Python by name).
struct CallResult {
  bool executed = false;
  bool blocked = false;  // strict: some pair would leave the fast path; nothing written
  bool bumped = false;   // the call moved the version counters itself (as stock's op it ran does)
  std::array<PathCounts, kNumPaths> paths{};
  std::array<int64_t, kNumKinds> reasons{};  // per reason: the pairs that left the fast path for it
  PathCounts& path(Path p) { return paths[p]; }
  int64_t& reason(Kind k) { return reasons[static_cast<int>(k)]; }
  // A fast call: some pair took a fast path. A fallback call: some pair left it (kFastPath,
  // kOffFastPath). A call may be both, or neither (only empty pairs).
  bool fast() const { return any_pair_on(kFastPath); }
  bool fallback() const { return any_pair_on(kOffFastPath); }

 private:
  bool any_pair_on(const bool* which) const {
    for (int p = 0; p < kNumPaths; ++p) {
      if (which[p] && paths[p].tensors != 0) return true;
    }
    return false;
  }
};

// The one builder of the result of a call handed to stock whole before any plan ran, for `why`
// (its pairs are that reason's, one launch each; a call of no pairs counts one): the
// interception's passthrough, the lazy-bit lists, the FSDP copies that stay stock's, the Python
// paths' passthroughs. `bumped`: stock's call made the version bumps.
CallResult stock_counts(Kind why, int64_t pairs, int64_t bytes, bool bumped = true);

// The result of a strict call refused for `why` (blocked; nothing written).
CallResult blocked_counts(Kind why, int64_t pairs);

// ``bump``: a whole-stock plan bumps each destination's version counter as stock does (the
// caller bumps the others once the call has succeeded, except those marked in ``self_bumped``
// (resized to the list): a device's fused kernel bumped them already, as it does under stock).
// `caps`: the snapshot the plan was made against. `serial_moved_bytes`: as CpuCopyBatch::run.
CallResult execute(const Plan& p, at::TensorList dsts, at::TensorList srcs, bool non_blocking, bool strict, bool bump,
                   const CapabilityTable& caps, std::vector<uint8_t>* self_bumped, int64_t serial_moved_bytes);

}  // namespace npu_dispatch
