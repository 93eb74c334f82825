#include "planner/copy_call.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/narrow.h>
#include <ATen/ops/split_with_sizes.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "planner/capability_table.h"
#include "planner/execute.h"
#include "planner/one_pass.h"
#include "planner/plan.h"

namespace npu_dispatch {

namespace {

thread_local int t_planner_depth = 0;

// The one-pass plan over the whole list; nullopt where it refuses the call (nothing written).
std::optional<CallResult> one_pass_scan(at::TensorList dsts, at::TensorList srcs, bool bump, int64_t serial_moved_bytes) {
  const size_t n = dsts.size();
  const auto caps = current_capabilities();  // the one-pass plan keeps pointers into it
  OnePassCall call(n);
  c10::TensorImpl** impls = call.impls();
  for (size_t i = 0; i < n; ++i) {
    impls[i] = dsts[i].unsafeGetTensorImpl();
    impls[n + i] = srcs[i].unsafeGetTensorImpl();
  }
  switch (call.prepare(*caps, /*grad_check=*/false, kReleaseGilBytes, bump, serial_moved_bytes)) {
    case OnePassCall::Step::Refused:
      return std::nullopt;
    case OnePassCall::Step::Prepared:
      call.copy();
      break;
    case OnePassCall::Step::Copied:
      break;
  }
  auto counts = call.counts();
  counts.bumped = true;  // OnePassCall moved every counter itself (or, without `bump`, none)
  return counts;
}

}  // namespace

bool inside_planner() { return t_planner_depth > 0; }

StockCall::StockCall() { ++t_planner_depth; }
StockCall::~StockCall() { --t_planner_depth; }

void stock_foreach_copy(at::TensorList dsts, at::TensorList srcs, bool non_blocking) {
  StockCall inside;
  at::_foreach_copy_(dsts, srcs, non_blocking);
}

bool foreach_copy_bumps_here(at::TensorList dsts) {
  if (bumps_here()) return true;
  const auto caps = current_capabilities();
  for (const auto& d : dsts) {
    if (d.defined() && !d.is_cpu()) {
      // CUDA's fused kernel bumps by itself (the executors watch it); op-plugin's batched kernels bump
      // nothing below ADInplaceOrView (device_batching.h). A device not known either way keeps them.
      const Capability* cap = caps->get(d.device().type());
      if (cap == nullptr || !(cap->whole_list || cap->batched_keeps_versions)) return true;
    }
  }
  return false;
}

CallResult plan_and_run(at::TensorList dsts, at::TensorList srcs, bool non_blocking, bool strict,
                        std::optional<bool> bump_rule, int64_t serial_moved_bytes) {
  StockCall inside;
  const bool bump = bump_rule.has_value() ? *bump_rule : foreach_copy_bumps_here(dsts);
  if (lazy_bit_dst(dsts) >= 0) {
    // Stock's dispatcher raises for such a list before checking it, so the stock op gives the
    // error (and, were it ever to accept the list, the copy and its bumps).
    at::_foreach_copy_(dsts, srcs, non_blocking);
    return stock_counts(Kind::ConjNeg, static_cast<int64_t>(dsts.size()), 0);
  }
  check_lists(dsts, srcs);
  if (auto fast = one_pass_scan(dsts, srcs, bump, serial_moved_bytes)) return *fast;  // nothing for strict to block
  CallResult counts;
  std::vector<uint8_t> self_bumped;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    const auto caps = current_capabilities();
    counts = execute(build_plan(dsts, srcs, *caps, non_blocking), dsts, srcs, non_blocking, strict, bump, *caps,
                     &self_bumped, serial_moved_bytes);
  }
  // As stock: a destination without a version counter (planner/execute.h) moves nothing inside
  // inference_mode (outside it the plan was stock's loop, which raised); others move even inside
  // inference_mode, unless both tensors of the pair are inference-keyed (stock_bumps_pair).
  if (bump && counts.executed && !counts.bumped) {
    bump_pairs_as_stock(dsts, srcs, c10::InferenceMode::is_enabled(), self_bumped);
  }
  return counts;
}

std::tuple<at::Tensor, at::Tensor> all_gather_copy_in(at::TensorList inputs, const at::Tensor& out,
                                                      c10::IntArrayRef sizes, int64_t numel, int64_t rank,
                                                      bool strict, std::optional<bool> bump, CallResult* counts) {
  auto slice = out.narrow(0, numel * rank, numel);
  const auto dsts = slice.split_with_sizes(sizes);
  {
    c10::AutoGradMode no_grad(false);
    // Each split moves the output's shared counter once, as stock's _foreach_copy_ there does.
    *counts = plan_and_run(dsts, inputs, false, strict, bump);
  }
  return {std::move(slice), out};
}

at::Tensor functional_output(const at::Tensor& d) {
  if (d.is_contiguous() || at::has_internal_overlap(d) != at::MemOverlap::Yes) {
    return at::empty_strided(d.sizes(), d.strides(), d.options());
  }
  return at::empty(d.sizes(), d.options());
}

Plan plan_of(at::TensorList dsts, at::TensorList srcs) {
  check_lists(dsts, srcs);
  return build_plan(dsts, srcs, *current_capabilities());
}

}  // namespace npu_dispatch
