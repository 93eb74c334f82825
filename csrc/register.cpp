// Op registration: the native-only ops (schemas here) and C++ kernels for the two public ops,
// whose schemas npu_dispatch/ops.py defines (its Python kernel stays the no-compiler path and
// serves every dispatch key not registered below).
#include <ATen/core/Tensor.h>
#include <ATen/ops/narrow.h>
#include <ATen/ops/split_with_sizes.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <chrono>

#include "capability_table.h"
#include "copy_call.h"
#include "cpu_copy_kernel.h"
#include "execute.h"
#include "fast_lane.h"
#include "native_stats.h"
#include "plan.h"
#include "sharded_lane.h"
#include "stream_copy.h"

namespace npu_dispatch {
namespace {

constexpr int64_t kAbiVersion = 8;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<int64_t> plan_op(at::TensorList self, at::TensorList src) {
  return plan_encoded(self, src);
}

// npu_dispatch/engine.py stock_bumps: below ADInplaceOrView stock's per-pair copy_ loop bumps no
// version counter. A batched kernel that bumps anyway (CUDA's) is seen by the executor, so CPU
// and whole_list_only devices need no bump of ours there; other accelerators keep the bumps.
bool bump_versions(at::TensorList dsts) {
  if (!c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView)) return true;
  const auto caps = current_capabilities();
  for (const auto& d : dsts) {
    if (d.defined() && !d.is_cpu()) {
      const Capability* cap = caps->get(d.device().type());
      if (cap == nullptr || !cap->whole_list) return true;
    }
  }
  return false;
}

void foreach_copy_kernel(at::TensorList self, at::TensorList src, bool non_blocking) {
  const int64_t t0 = now_ns();
  const auto counts = plan_and_run(self, src, non_blocking, false, bump_versions(self));
  record_direct(kOpForeachCopy, counts, now_ns() - t0);
}

std::tuple<at::Tensor, at::Tensor> all_gather_copy_in_kernel(
    at::TensorList all_gather_inputs, const at::Tensor& all_gather_output,
    c10::IntArrayRef inp_split_sizes, int64_t all_gather_input_numel, int64_t rank) {
  const int64_t t0 = now_ns();
  auto all_gather_input =
      all_gather_output.narrow(0, all_gather_input_numel * rank, all_gather_input_numel);
  const auto dsts = all_gather_input.split_with_sizes(inp_split_sizes);
  std::vector<int64_t> counts;
  {
    c10::AutoGradMode no_grad(false);
    counts = plan_and_run(dsts, all_gather_inputs, false, false, bump_versions({all_gather_output}));
  }
  record_direct(kOpAllGatherCopyIn, counts, now_ns() - t0);
  return {all_gather_input, all_gather_output};
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
  m.def("_plan(Tensor[] self, Tensor[] src) -> int[]");
  m.def("_set_capabilities(str[] device_types, int[] table, ScalarType[] dtypes) -> ()",
        &set_capabilities_op);
  m.def("_self_check() -> int[]", &self_check);
  m.def("_native_info() -> int[]", &info_op);
  m.def("_drain_stats() -> int[]", &drain_direct);
}

// Planning reads metadata only and stock takes whatever it cannot place, so one kernel serves
// every backend (meta included: the plan sends it to stock).
TORCH_LIBRARY_IMPL(npu_dispatch, CompositeExplicitAutograd, m) {
  m.impl("_plan", &npu_dispatch::plan_op);
}

#define NPU_DISPATCH_REGISTER_BACKEND(KEY)                                      \
  TORCH_LIBRARY_IMPL(npu_dispatch, KEY, m) {                                    \
    m.impl("foreach_copy_", &npu_dispatch::foreach_copy_kernel);                \
    m.impl("all_gather_copy_in", &npu_dispatch::all_gather_copy_in_kernel);     \
  }

NPU_DISPATCH_REGISTER_BACKEND(CPU)
NPU_DISPATCH_REGISTER_BACKEND(CUDA)
NPU_DISPATCH_REGISTER_BACKEND(PrivateUse1)
