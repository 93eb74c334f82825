// C++ kernels at CPU, CUDA and PrivateUse1 for two of the library's four ops, foreach_copy_ and
// all_gather_copy_in, whose schemas npu_dispatch/ops.py defines. Their Python kernels serve every
// other dispatch key and machines without the native library; split_with_sizes_copy and chunk_cat
// keep their Python kernels everywhere, which call the C++ entries directly
// (binding/python_entry.cpp).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "planner/copy_call.h"
#include "dispatch/mode_scope.h"
#include "dispatch/native_stats.h"

namespace npu_dispatch {
namespace {

void foreach_copy_kernel(at::TensorList self, at::TensorList src, bool non_blocking) {
  const int64_t t0 = now_ns();
  const auto counts = plan_and_run(self, src, non_blocking, false, stock_bumps(self));
  record_call(kOpForeachCopy, counts, now_ns() - t0);
}

std::tuple<at::Tensor, at::Tensor> all_gather_copy_in_kernel(
    at::TensorList all_gather_inputs, const at::Tensor& all_gather_output,
    c10::IntArrayRef inp_split_sizes, int64_t all_gather_input_numel, int64_t rank) {
  const int64_t t0 = now_ns();
  std::vector<int64_t> counts;
  auto result = all_gather_copy_in(all_gather_inputs, all_gather_output, inp_split_sizes, all_gather_input_numel,
                                   rank, &counts);
  record_call(kOpAllGatherCopyIn, counts, now_ns() - t0);
  return result;
}

}  // namespace
}  // namespace npu_dispatch

#define NPU_DISPATCH_REGISTER_BACKEND(KEY)                                      \
  TORCH_LIBRARY_IMPL(npu_dispatch, KEY, m) {                                    \
    m.impl("foreach_copy_", &npu_dispatch::foreach_copy_kernel);                \
    m.impl("all_gather_copy_in", &npu_dispatch::all_gather_copy_in_kernel);     \
  }

NPU_DISPATCH_REGISTER_BACKEND(CPU)
NPU_DISPATCH_REGISTER_BACKEND(CUDA)
NPU_DISPATCH_REGISTER_BACKEND(PrivateUse1)
