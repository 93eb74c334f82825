// One `_foreach_copy_` through the native planner: what every entry point (the C++ kernels of
// the public ops, npu_dispatch::_foreach_copy_planned, the Python fast entry) runs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace npu_dispatch {

// Checks the lists, plans against the capability table in force and executes (nothing when
// `strict` finds a fallback). Copies are issued below ADInplaceOrView; with `bump`, each listed
// destination's version counter then moves once, as stock's in-place kernel does (the caller
// decides when: the Python engine passes its own rule). Returns the count vector of execute.h.
// With `defer_if_grad`, nothing runs (flags kDeferred) when grad mode is on and a tensor
// requires grad: the caller bypassed the dispatcher, whose Autograd kernel must see such a call.
std::vector<int64_t> plan_and_run(at::TensorList dsts, at::TensorList srcs, bool non_blocking,
                                  bool strict, bool bump, bool defer_if_grad = false);

// The plan of plan.cpp encode_plan, against the table in force; nothing is written.
std::vector<int64_t> plan_encoded(at::TensorList dsts, at::TensorList srcs);

}  // namespace npu_dispatch
