// FSDP2's all-gather copy-out and reduce-scatter copy-in on the fast path, as
// torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py calls them:
//   fsdp::split_with_sizes_copy(all_gather_output.view(world, -1), sizes, dim=1, out=[...])
//   fsdp::chunk_cat(grads, 0, world, out=reduce_scatter_input.view(world, -1))
// Which path a device takes is one question of its capability (copies.cpp fsdp_route):
// where the CPU kernel serves it (planner/capability_table.h cpu_kernel_serves), the copy-out's
// contiguous 1-D pieces (row r of parameter i) are one pass of fsdp/copy_out_kernel.h and chunk_cat
// one pass of fsdp/chunk_cat_kernel.h over out's elements (each gradient's chunk, widened as it
// goes, and its zero padding). On another device with a capability that is not whole_list_only,
// the copy-out's pieces go to the one planner as a _foreach_copy_ of row views (its groups and
// the device's batched kernel), and chunk_cat stays the device's own op (device_op: one call,
// fewer launches than its pieces). No capability (no_capability) or a whole_list_only device
// (whole_list_op, CUDA: kernels of its own): stock's op. Anything refused is refused before a
// byte is written, and the caller runs stock's op.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "planner/execute.h"
#include "planner/plan.h"
#include "planner/spans.h"

namespace npu_dispatch {

// copy_out: aten::split_with_sizes_copy.out's result: out[i] = src.split_with_sizes(sizes, dim)[i]. Served
// where src and every out[i] are contiguous, of one dtype and device, out[i] exactly the split's
// shape and nothing overlaps; else nullopt, *why set, nothing written. With `bump`, each out[i]'s
// version counter moves once, as stock's out= op does (none below ADInplaceOrView).
std::optional<CallResult> copy_out(const at::Tensor& src, c10::IntArrayRef sizes, int64_t dim, at::TensorList out,
                                   bool strict, bool bump, Kind* why);

// aten::_chunk_cat.out's result (aten/src/ATen/native/TensorShape.cpp _pad_chunk + cat_out): each
// tensor zero-padded along `dim` to a multiple of num_chunks, viewed as [..., num_chunks, -1], and
// concatenated along dim + 1 into `out`, cast to out's dtype. Served where every tensor is contiguous
// with stock's preconditions met, out is contiguous of exactly the result's shape, the cast is one
// the CPU kernel reproduces and out overlaps no input (inputs, only read, may overlap each other);
// on a device without a host pass, nullopt (its own op is one call).
// `autograd_check`: refuse a tensor that requires grad under grad mode (requires_grad), as stock's
// out= autograd kernel raises; false where the op runs below autograd (chunk_cat_mixed_dtype).
std::optional<CallResult> chunk_cat(at::TensorList tensors, int64_t dim, int64_t num_chunks, const at::Tensor& out,
                                    bool strict, bool bump, Kind* why, bool autograd_check = true);

// chunk_cat_mixed: fsdp::chunk_cat_mixed_dtype (torch 2.15, torch/csrc/distributed/fsdp/ChunkCat.h): chunk_cat of
// inputs that may differ in dtype, each cast to out's dtype first. One dtype: chunk_cat above. Mixed
// (FSDP2's bf16 and fp32 gradients into an fp32 reduce-scatter input): on the CPU one pass of the
// kernel per input dtype, each a byte copy or a widening cast, over the same preconditions as
// chunk_cat; anything else nullopt, *why set, nothing written. No out= autograd check (upstream's
// op runs below autograd). `bump`: out's counter once (false below ADInplaceOrView, where the op's
// own ADInplaceOrView kernel bumps it).
std::optional<CallResult> chunk_cat_mixed(at::TensorList tensors, int64_t dim, int64_t num_chunks,
                                          const at::Tensor& out, bool strict, bool bump, Kind* why);

// The Python debugging mode's entries (binding/module.cpp): served as above, else stock's op run
// here (its checks, messages, warnings, writes; with `bump`, out's version bumps where this
// level has none), or, under `strict`, nothing written and the reason returned blocked.
// `mixed`: the op is chunk_cat_mixed (its own op's kernel is the stock call; its ADInplaceOrView
// kernel bumps out, so nothing here does).
CallResult copy_out_or_stock(const at::Tensor& src, c10::IntArrayRef sizes, int64_t dim, at::TensorList out,
                             bool strict, bool bump);
CallResult chunk_cat_or_stock(at::TensorList tensors, int64_t dim, int64_t num_chunks, const at::Tensor& out,
                              bool strict, bool bump, bool mixed);

}  // namespace npu_dispatch
