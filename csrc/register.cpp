// C++ kernels for the library's ops, whose schemas npu_dispatch/ops.py defines (its Python
// kernel serves every dispatch key not registered below, and the machines without a compiler).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <ATen/ops/_chunk_cat.h>
#include <ATen/ops/split_with_sizes_copy.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "copy_call.h"
#include "fsdp_copies.h"
#include "mode_scope.h"
#include "native_stats.h"

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

// The copy-out / chunk_cat ops: served by fsdp_copies.h, else stock's aten op.
void split_with_sizes_copy_kernel(const at::Tensor& src, c10::IntArrayRef sizes, int64_t dim, at::TensorList out) {
  const int64_t t0 = now_ns();
  Kind why = Kind::MayRaise;
  const bool bump = !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView);
  auto counts = split_with_sizes_copy(src, sizes, dim, out, false, bump, &why);
  if (!counts) {
    at::split_with_sizes_copy_out(out, src, sizes, dim);
    int64_t bytes = 0;
    for (const auto& o : out) bytes += o.numel() * static_cast<int64_t>(o.element_size());
    counts = stock_counts(why, std::max<int64_t>(static_cast<int64_t>(out.size()), 1), bytes);
  }
  record_call(kOpSplitWithSizesCopy, *counts, now_ns() - t0);
}

void chunk_cat_kernel(at::TensorList tensors, int64_t dim, int64_t num_chunks, const at::Tensor& out) {
  const int64_t t0 = now_ns();
  Kind why = Kind::MayRaise;
  const bool bump = !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView);
  auto counts = chunk_cat(tensors, dim, num_chunks, out, false, bump, &why);
  if (!counts) {
    auto o = out;
    at::_chunk_cat_out(o, tensors, dim, num_chunks);
    counts = stock_counts(why, std::max<int64_t>(static_cast<int64_t>(tensors.size()), 1),
                          out.numel() * static_cast<int64_t>(out.element_size()));
  }
  record_call(kOpChunkCat, *counts, now_ns() - t0);
}

}  // namespace
}  // namespace npu_dispatch

#define NPU_DISPATCH_REGISTER_BACKEND(KEY)                                      \
  TORCH_LIBRARY_IMPL(npu_dispatch, KEY, m) {                                    \
    m.impl("foreach_copy_", &npu_dispatch::foreach_copy_kernel);                \
    m.impl("all_gather_copy_in", &npu_dispatch::all_gather_copy_in_kernel);     \
    m.impl("split_with_sizes_copy", &npu_dispatch::split_with_sizes_copy_kernel); \
    m.impl("chunk_cat", &npu_dispatch::chunk_cat_kernel);                       \
  }

NPU_DISPATCH_REGISTER_BACKEND(CPU)
NPU_DISPATCH_REGISTER_BACKEND(CUDA)
NPU_DISPATCH_REGISTER_BACKEND(PrivateUse1)
