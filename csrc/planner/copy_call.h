// One `_foreach_copy_` through the native planner: what every entry that reaches it through the
// dispatcher runs (the interception kernels of dispatch/intercept.h, the kernels of the npu_dispatch ops,
// the Python debugging mode's handler). The public npu_dispatch.foreach_copy_ called from Python
// tries the one-pass plan first (binding/direct_entry.cpp) and comes here when it refuses.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "planner/execute.h"
#include "planner/plan.h"
#include "planner/tuning.h"

namespace npu_dispatch {

// Checks the lists (stock's errors and messages), then the one-pass plan (planner/one_pass.h) as the
// planner's first pass, then the full plan against the capability table in force, and executes
// (nothing when `strict` finds a fallback). Copies are issued below ADInplaceOrView; where
// `bump_rule` is true, each listed destination's version counter then moves once, as stock's
// in-place kernel does (nullopt: stock's rule where the call is made, foreach_copy_bumps_here(dsts)).
// The CPU passes stay on the calling thread up to `serial_moved_bytes` (CpuCopyBatch::run).
// Returns the CallResult (planner/execute.h). While it runs, the thread is inside_planner().
CallResult plan_and_run(at::TensorList dsts, at::TensorList srcs, bool non_blocking, bool strict,
                        std::optional<bool> bump_rule = std::nullopt,
                        int64_t serial_moved_bytes = kDispatchedSerialMovedBytes);

// FSDP2's all-gather copy-in, as torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py
// all_gather_copy_in does it: narrow the output to this rank's slice, split it by the sizes, and
// copy the inputs into the splits under no_grad (plan_and_run, with `strict` and `bump` as its
// `bump_rule`). Returns
// (slice, output), the slice a view of the output (with autograd view metadata where
// ADInplaceOrView is in reach, as stock's); narrow and split raise stock's errors before anything
// is written. `counts` receives its CallResult.
std::tuple<at::Tensor, at::Tensor> all_gather_copy_in(at::TensorList inputs, const at::Tensor& out,
                                                      c10::IntArrayRef sizes, int64_t numel, int64_t rank,
                                                      bool strict, std::optional<bool> bump, CallResult* counts);

// The output stock's functional _foreach_copy allocates for destination `d`: a clone's layout
// (d's sizes and strides, contiguous where d overlaps itself), uninitialised, as every element
// is overwritten.
at::Tensor functional_output(const at::Tensor& d);

// The plan against the table in force, for explain(); nothing is written.
Plan plan_of(at::TensorList dsts, at::TensorList srcs);

// Stock's _foreach_copy_ with the interception kernels stepping aside (as for the planner's own
// stock calls): the debugging mode's reference for `verify`, inside an entered mode too.
void stock_foreach_copy(at::TensorList dsts, at::TensorList srcs, bool non_blocking);

// Whether this thread is inside plan_and_run or a StockCall: the stock ops it issues (a device's
// own batched kernel, stock's per-pair loop, a refused call's own kernel) must reach the backends,
// not the interception kernels again.
bool inside_planner();

// While alive, owned ops called on this thread pass the interception kernels by, uncounted: a
// call the library has counted already, handed to stock's kernel, which may call another owned op
// (FSDP's copy-out calls aten's, itself an owned op).
struct StockCall {
  StockCall();
  ~StockCall();
  StockCall(const StockCall&) = delete;
  StockCall& operator=(const StockCall&) = delete;
};

// Whether an in-place or out= op called here moves its outputs' version counters: ADInplaceOrView
// is in reach (not excluded, as it is below that key).
inline bool bumps_here() { return !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView); }

// Whether stock's _foreach_copy_ called here would bump the destinations' version counters:
// always, except below ADInplaceOrView, where its per-pair copy_ loop bumps none. There the CPU,
// whole_list_only devices (CUDA's fused kernel bumps anyway, and the executor sees it) and devices
// whose batched kernels move no counter (batched_keeps_versions: op-plugin's) need no bump of ours;
// a device not known either way keeps them.
bool foreach_copy_bumps_here(at::TensorList dsts);

}  // namespace npu_dispatch
