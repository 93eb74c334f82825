// NpuFastCopyMode's interception: C++ kernels at the BackendSelect dispatch key for the stock ops
// the mode owns (the intercepted rows of dispatch/owned_ops.h). A call
// reaches BackendSelect after everything above it has acted (autograd and version counters,
// functionalization, the Python key: tensor subclasses, fake and proxy modes), so these kernels
// see plain tensors only. Inside an entered mode (dispatch/mode_scope.h) and outside the planner's own
// stock calls, they run the one planner (planner/copy_call.h); anything else, and every call outside a
// mode, is redispatched below BackendSelect unchanged: op-plugin's PrivateUse1 kernel, CUDA's,
// ATen's, FSDP's Python kernel. Ops not listed here never meet this library.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <vector>

#include "planner/classify.h"
#include "planner/execute.h"

namespace npu_dispatch {

// Registers the interception kernel of each intercepted row of dispatch/owned_ops.h in the aten
// namespace, and of the rows named in `served` (qualified names, "fsdp::chunk_cat": ops that exist
// with the row's schema, which npu_dispatch/mode.py checks). Once per op; the registration lasts
// the process, and a kernel with no mode entered only redispatches.
void install_interception(const std::vector<std::string>& served);
// The result of a call of `op` handed to stock whole for `why` (stock_counts, planner/execute.h):
// pairs, the length of its first tensor list in schema order (the copy-out's out, chunk_cat's
// tensors, a foreach copy's self), 1 where it has none; bytes, those of the arguments the schema
// marks written, or, where it marks none (the functional copy, FSDP's copy-in), of that first list,
// a tensor subclass's (fake tensors included) or symbolic sizes' counting none. `stack` holds the
// call's arguments last.
CallResult whole_call_counts(const c10::OperatorHandle& op, const torch::jit::Stack& stack, Kind why);

// For an owned op whose installed schema is not the one this library serves: a boxed kernel
// that counts each call inside a mode (reason "schema") and redispatches it unchanged, any owned
// op its kernel calls passing the interception by. `qualified`: "ns::name[.overload]".
void install_passthrough(const std::string& qualified);

// For NpuFastCopyMode's Python dispatch-mode path (npu_dispatch/mode.py), whose handler runs with
// ADInplaceOrView excluded whatever the caller did: a kernel at ADInplaceOrView for an owned op
// ("aten::_foreach_copy_", "fsdp::all_gather_copy_in", ...: default overload) that only notes, for
// the call it passes on, that ADInplaceOrView was in reach (stock's copies would then bump their
// destinations) and how many Python dispatch modes were on the stack. It changes nothing else; an
// op with a kernel of its own there gets none (false). Installed once per op, for the process.
bool install_in_reach_marker(const std::string& qualified);
// What the innermost marked call on this thread found: the Python dispatch modes then on the
// stack, or -1 where no marked call is under way (ADInplaceOrView was not in reach).
int64_t in_reach_modes();

}  // namespace npu_dispatch
