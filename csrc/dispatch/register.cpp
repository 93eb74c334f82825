// The C++ backend kernels (CPU, CUDA, PrivateUse1) of the library's own ops, for the rows of
// dispatch/owned_ops.h that name one; npu_dispatch/ops.py defines the schemas and keeps Python
// kernels for every other dispatch key (and for the rows marked python_kernel, on every key).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstddef>
#include <string>

#include "planner/copy_call.h"
#include "dispatch/mode_scope.h"
#include "dispatch/native_stats.h"

namespace npu_dispatch {
namespace {

void foreach_copy_kernel(at::TensorList self, at::TensorList src, bool non_blocking) {
  const int64_t t0 = now_ns();
  const auto counts = plan_and_run(self, src, non_blocking, false);
  record_call(kOpForeachCopy, counts, now_ns() - t0);
}

std::tuple<at::Tensor, at::Tensor> all_gather_copy_in_kernel(
    at::TensorList all_gather_inputs, const at::Tensor& all_gather_output,
    c10::IntArrayRef inp_split_sizes, int64_t all_gather_input_numel, int64_t rank) {
  const int64_t t0 = now_ns();
  CallResult counts;
  auto result = all_gather_copy_in(all_gather_inputs, all_gather_output, inp_split_sizes, all_gather_input_numel,
                                   rank, false, std::nullopt, &counts);
  record_call(kOpAllGatherCopyIn, counts, now_ns() - t0);
  return result;
}

// A row whose op keeps its Python kernel on every backend.
constexpr std::nullptr_t python_kernel = nullptr;

template <typename Fn>
void impl(torch::Library& m, CountedOp op, Fn* kernel) {
  m.impl(std::string(kOwnedOps[op].impl_name()).c_str(), kernel);
}
void impl(torch::Library&, CountedOp, std::nullptr_t) {}

void register_backend(torch::Library& m) {
#define NPU_DISPATCH_STOCK_OP(id, kernel, wrapper, copy, schema)
#define NPU_DISPATCH_LIBRARY_OP(id, kernel, wrapper, copy, schema) impl(m, kOp##id, kernel);
#include "dispatch/owned_ops.h"
#undef NPU_DISPATCH_STOCK_OP
#undef NPU_DISPATCH_LIBRARY_OP
}

}  // namespace
}  // namespace npu_dispatch

TORCH_LIBRARY_IMPL(npu_dispatch, CPU, m) { npu_dispatch::register_backend(m); }
TORCH_LIBRARY_IMPL(npu_dispatch, CUDA, m) { npu_dispatch::register_backend(m); }
TORCH_LIBRARY_IMPL(npu_dispatch, PrivateUse1, m) { npu_dispatch::register_backend(m); }
