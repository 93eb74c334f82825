// Op registration: the native-only ops (schemas here) and C++ kernels for the two public ops,
// whose schemas npu_dispatch/ops.py defines (its Python kernel stays the no-compiler path and
// serves every dispatch key not registered below).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "capability_table.h"
#include "copy_call.h"
#include "cpu_copy_kernel.h"
#include "fast_lane.h"
#include "mode_scope.h"
#include "native_stats.h"
#include "sharded_lane.h"
#include "stream_copy.h"

namespace npu_dispatch {
namespace {

constexpr int64_t kAbiVersion = 9;

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

void set_capabilities_op(std::vector<std::string> device_types, std::vector<int64_t> table,
                         std::vector<c10::ScalarType> dtypes) {
  set_capabilities(device_types, table, dtypes);
}

std::vector<int64_t> info_op() {
  auto out = kernel_counters();
  out.insert(out.begin(), kAbiVersion);
  out.push_back(fast_lane_calls());
  out.push_back(sharded_lane_calls());
  out.push_back(stream_moved_bytes());
  return out;
}

}  // namespace
}  // namespace npu_dispatch

TORCH_LIBRARY_FRAGMENT(npu_dispatch, m) {
  using namespace npu_dispatch;
  m.def("_set_capabilities(str[] device_types, int[] table, ScalarType[] dtypes) -> ()",
        &set_capabilities_op);
  m.def("_self_check() -> int[]", &self_check);
  m.def("_native_info() -> int[]", &info_op);
  m.def("_drain_stats() -> int[]", &drain_direct);
}

#define NPU_DISPATCH_REGISTER_BACKEND(KEY)                                      \
  TORCH_LIBRARY_IMPL(npu_dispatch, KEY, m) {                                    \
    m.impl("foreach_copy_", &npu_dispatch::foreach_copy_kernel);                \
    m.impl("all_gather_copy_in", &npu_dispatch::all_gather_copy_in_kernel);     \
  }

NPU_DISPATCH_REGISTER_BACKEND(CPU)
NPU_DISPATCH_REGISTER_BACKEND(CUDA)
NPU_DISPATCH_REGISTER_BACKEND(PrivateUse1)
