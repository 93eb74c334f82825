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
// `served`: the intercepted ops outside aten to be served ("fsdp::chunk_cat"), which exist only
// once their Python module is imported (npu_dispatch/mode.py finds them and checks their schemas
// against dispatch/owned_ops.h).
std::vector<Fact> static_facts(const std::vector<std::string>& served);

// After install_interception(): one aten::_foreach_copy_ of two CPU tensors, called from the
// top of the dispatcher inside a scope of its own, reaches the kernel (counted once), copies, and
// moves the destination's version counter exactly once, as stock does.
Fact live_fact();


}  // namespace npu_dispatch
