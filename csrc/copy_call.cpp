#include "copy_call.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/_foreach_copy.h>
#include <c10/core/GradMode.h>

#include "capability_table.h"
#include "execute.h"
#include "fast_lane.h"
#include "plan.h"

namespace npu_dispatch {

namespace {

bool any_requires_grad(at::TensorList ts) {
  for (const auto& t : ts) {
    if (t.requires_grad()) return true;
  }
  return false;
}

}  // namespace

std::vector<int64_t> plan_and_run(at::TensorList dsts, at::TensorList srcs, bool non_blocking,
                                  bool strict, bool bump, bool defer_if_grad) {
  if (lazy_bit_dst(dsts) >= 0) {
    // plan.py lazy_bit_dst: stock's dispatcher raises for such a list before checking it, so the
    // stock op gives the error (and, were it ever to accept the list, the copy and its bumps).
    at::_foreach_copy_(dsts, srcs, non_blocking);
    std::vector<int64_t> v(kCountsLen, 0);
    v[0] = kExecuted | kBumped;
    v[path_slot(kStock, 0)] = static_cast<int64_t>(dsts.size());
    v[path_slot(kStock, 2)] = static_cast<int64_t>(dsts.size());
    v[reason_slot(Kind::ConjNeg)] = 1;
    return v;
  }
  check_lists(dsts, srcs);
  if (defer_if_grad && c10::GradMode::is_enabled() &&
      (any_requires_grad(dsts) || any_requires_grad(srcs))) {
    std::vector<int64_t> deferred(kCountsLen, 0);
    deferred[0] = kDeferred;
    return deferred;
  }
  std::vector<int64_t> counts;
  std::vector<uint8_t> self_bumped;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    const auto caps = current_capabilities();
    // One thread's lane, even for long lists: calls through the dispatcher carry a hundred
    // microseconds of boxing and Python around the copy, and there the sharded lane's threads
    // never gained (tiny_many under NpuFastCopyMode: 140.6 us with one thread's lane, 143.6 and
    // 144.1 us sharded, in alternating processes; the direct op: 16.5 against 13 us).
    FastLane lane;
    if (lane.prepare(dsts, srcs, *caps)) {
      counts = lane.run();  // all pairs fast: nothing for strict to block
    } else {
      counts = execute(build_plan(dsts, srcs, *caps), dsts, srcs, non_blocking, strict, bump, &self_bumped);
    }
  }
  // As stock: a destination without a version counter (execute.h) moves nothing inside
  // inference_mode (outside it the plan was stock's loop, which raised); others move even inside
  // inference_mode, unless both tensors of the pair are inference-keyed (stock_bumps_pair).
  if (bump && (counts[0] & kExecuted) && !(counts[0] & kBumped)) {
    const bool in_inference = c10::InferenceMode::is_enabled();
    for (size_t i = 0; i < dsts.size(); ++i) {
      const auto& t = dsts[i];
      if (stock_bumps_pair(t, srcs[i], in_inference) && (self_bumped.empty() || !self_bumped[i])) {
        t.unsafeGetTensorImpl()->bump_version();
      }
    }
  }
  return counts;
}

std::vector<int64_t> plan_encoded(at::TensorList dsts, at::TensorList srcs) {
  check_lists(dsts, srcs);
  return encode_plan(build_plan(dsts, srcs, *current_capabilities()));
}

}  // namespace npu_dispatch
