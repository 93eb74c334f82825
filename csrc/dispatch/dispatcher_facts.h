// What the interception kernels (dispatch/intercept.h) rely on in the torch they run in, checked in that
// torch when the library installs them, instead of a list of torch versions. Each fact that fails
// is named by `python -m npu_dispatch doctor`, and NpuFastCopyMode then takes its Python dispatch
// mode path (npu_dispatch/mode.py), which gives stock's results at a per-op cost.
#pragma once

#include <string>
#include <vector>

namespace npu_dispatch {

struct Fact {
  std::string name;    // short and stable: doctor prints it, tests refer to it
  bool holds;
  std::string detail;  // what was checked, or what was found instead
};

// The facts that hold or fail before any kernel is registered: the aten ops' schemas (the
// kernels are typed on them), no ADInplaceOrView kernel on aten::_foreach_copy_ (the planner makes
// its version bumps; a kernel there would double them), and no CompositeImplicitAutograd kernel on
// any owned op (it would decompose the call above BackendSelect, where the kernels sit).
// `fsdp_ops`: the fsdp:: ops to be served (their schemas are checked by the caller).
std::vector<Fact> static_facts(const std::vector<std::string>& fsdp_ops);

// After install_aten_interception(): one aten::_foreach_copy_ of two CPU tensors, called from the
// top of the dispatcher inside a scope of its own, reaches the kernel (counted once), copies, and
// moves the destination's version counter exactly once, as stock does.
Fact live_fact();

// The fsdp:: copy ops the interception serves, each with the schema its kernel is typed on
// (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py; chunk_cat_mixed_dtype from torch 2.15,
// torch/csrc/distributed/fsdp/ChunkCat.h). An op found with another schema passes through to stock.
struct FsdpOp {
  const char* name;    // without the namespace: "all_gather_copy_in"
  const char* schema;  // as str(torch.ops.fsdp.<name>.default._schema) prints it
};
inline constexpr FsdpOp kFsdpOps[] = {
    {"all_gather_copy_in",
     "fsdp::all_gather_copy_in(Tensor[] all_gather_inputs, Tensor all_gather_output, SymInt[] inp_split_sizes, "
     "SymInt all_gather_input_numel, SymInt rank) -> (Tensor, Tensor)"},
    {"split_with_sizes_copy",
     "fsdp::split_with_sizes_copy(Tensor all_gather_output, SymInt[] all_gather_input_split_sizes, int dim=0, *, "
     "Tensor(a!)[] out) -> ()"},
    {"chunk_cat", "fsdp::chunk_cat(Tensor[] tensors, int dim, int num_chunks, *, Tensor(a!) out) -> ()"},
    {"chunk_cat_mixed_dtype",
     "fsdp::chunk_cat_mixed_dtype(Tensor[] tensors, int dim, int num_chunks, *, Tensor(a!) out) -> ()"},
};

}  // namespace npu_dispatch
