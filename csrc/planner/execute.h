// Runs a plan and reports what it did as a fixed-size count vector (binding/to_python.h hands it
// to Python by name).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "planner/plan.h"

namespace npu_dispatch {

// Count vector layout (binding/to_python.cpp hands it to Python by name):
//   [0] flags, then (tensors, bytes, launches) for each Path, then per reason Kind the pairs that
//   left the fast path for it (a whole-stock call: all its pairs, for its reason).
enum Path : int { kCoalesced = 0, kForeach, kFallback, kStock, kEmpty, kStaged, kNumPaths };
// Path's names, in the order reports list them, and which of them are the fast path (a call with a
// pair on one is a fast call) or off it (a fallback call).
inline constexpr const char* kPathNames[] = {"coalesced", "foreach", "fallback", "stock", "empty", "staged"};
inline constexpr bool kFastPath[] = {true, true, false, false, false, true};
inline constexpr bool kOffFastPath[] = {false, false, true, true, false, false};
static_assert(sizeof(kPathNames) / sizeof(kPathNames[0]) == kNumPaths, "a name per Path");
static_assert(sizeof(kFastPath) / sizeof(kFastPath[0]) == kNumPaths, "a flag per Path");
static_assert(sizeof(kOffFastPath) / sizeof(kOffFastPath[0]) == kNumPaths, "a flag per Path");
constexpr int64_t kExecuted = 1;
constexpr int64_t kBlocked = 2;  // strict: some pair would leave the fast path; nothing written
constexpr int64_t kBumped = 8;  // the executor bumped the version counters itself (stock plans)
constexpr int kCountsLen = 1 + 3 * kNumPaths + kNumKinds;

inline int path_slot(Path p, int field) { return 1 + 3 * p + field; }
inline int reason_slot(Kind k) { return 1 + 3 * kNumPaths + static_cast<int>(k); }

// Whether stock's copy of the pair moves dst's version counter (when bumps apply at all). Inside
// inference mode stock bumps a pair only when one of its tensors is not inference-keyed, so a
// destination with a counter but inference keys stays put with an inference source.
inline bool stock_bumps_pair(const at::Tensor& dst, const at::Tensor& src, bool in_inference) {
  return has_version_counter(dst) && (!in_inference || !dst.is_inference() || !src.is_inference());
}

// The one builder of the count vector of a call handed to stock whole before any plan ran, for
// `why` (its pairs are that reason's, one launch each): the interception's passthrough, the
// lazy-bit lists, the FSDP copies that stay stock's. `flags`: kExecuted, with kBumped where stock's
// call made the version bumps.
std::vector<int64_t> stock_counts(Kind why, int64_t pairs, int64_t bytes, int64_t flags = kExecuted | kBumped);

// The count vector of a strict call refused for `why` (kBlocked; nothing written).
std::vector<int64_t> blocked_counts(Kind why, int64_t pairs);

// ``bump``: a whole-stock plan bumps each destination's version counter as stock does (the
// caller bumps the others once the call has succeeded, except those marked in ``self_bumped``
// (resized to the list): a device's fused kernel bumped them already, as it does under stock).
// `caps`: the snapshot the plan was made against.
std::vector<int64_t> execute(const Plan& p, at::TensorList dsts, at::TensorList srcs, bool non_blocking,
                             bool strict, bool bump, const CapabilityTable& caps, std::vector<uint8_t>* self_bumped);

}  // namespace npu_dispatch
