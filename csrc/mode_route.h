// NpuFastCopyMode's dispatch route: a kernel of aten::_foreach_copy_ at the PythonTLSSnapshot
// dispatch key, the first key a call meets while any dispatch mode is active (its fallback only
// snapshots the thread's dispatch state and redispatches). Where the only mode on the stack is an
// entered NpuFastCopyMode and nothing else would act on the call (csrc/lane_call.h
// lane_keys_plain, no forward AD level), the fast lane copies it right there; the dispatcher
// never boxes its tensors for Python (about 0.2 us a tensor on the CI machine, more than the
// lane's whole copy of a list of tiny tensors). Anything else, and anything the lane refuses
// (nothing written then), continues exactly as that fallback would send it: to autograd, then
// to the mode's __torch_dispatch__, whose planner gives stock's results and errors.
//
// The lane takes a call only where the mode's handler would have reached stock's results by the
// same lane (plain CPU tensors, no overlap, nothing requiring grad under grad mode): results,
// version bumps (none below ADInplaceOrView, as stock's copy_ loop makes none there) and errors
// are those of the stock op without a mode.
#pragma once

#include <Python.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace npu_dispatch {

// Registers the kernel (once per process; npu_dispatch's mode asks on its first __enter__).
void install_mode_route();

// `mode` (an NpuFastCopyMode the route may serve) was pushed / popped by this thread. Entries
// nest; the object is kept alive while entered. GIL held. With `probe` (the benchmark's floor,
// npu_dispatch/bench), the route takes every call that passes its context checks for `mode`
// (the lane's own checks skipped) and does nothing: what reaching the route costs. With
// `probe_copy` too, it copies probe_copy->second into probe_copy->first (the fast lane, one
// pair) instead of the call's lists: reaching the route and moving as many bytes with no
// per-pair work (one thread at a time: concurrent calls would write the pair together). The pair
// is copied once on entry to check it: std::invalid_argument (nothing entered) where the lane
// refuses it. A nested entry of an entered mode keeps the first entry's probe settings.
void route_mode_entered(PyObject* mode, bool probe,
                        const std::optional<std::pair<at::Tensor, at::Tensor>>& probe_copy = std::nullopt);
// Returns the counters the route kept for `mode` since the last drain (native_stats.h layout),
// and forgets it once its last entry is popped.
std::vector<int64_t> route_mode_exited(PyObject* mode);
// The counters kept for an entered `mode` since the last drain; empty if it is not entered.
std::vector<int64_t> drain_route_mode(PyObject* mode);

// Calls the route has copied since load (tests check which way a call went).
int64_t mode_route_calls();

}  // namespace npu_dispatch
