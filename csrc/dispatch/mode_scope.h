// An entered NpuFastCopyMode as C++ sees it: a scope carried in c10::ThreadLocalDebugInfo, which
// at::ThreadLocalState copies to the threads PyTorch runs work on for the entering thread (the
// autograd engine's device threads, at::launch), so FSDP2's backward hooks see it too. Only the
// owned ops' kernels ever read it (dispatch/intercept.h): every other op pays nothing.
#pragma once

#include <c10/util/ThreadLocalDebugInfo.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "dispatch/native_stats.h"

namespace npu_dispatch {

struct ModeScope {
  std::shared_ptr<OpStats> stats = std::make_shared<OpStats>();
};

// The innermost scope the calling thread runs under, or nullptr (no mode entered).
ModeScope* active_scope();

// Scopes by id, one per NpuFastCopyMode object (Python holds the id).
int64_t scope_new();
void scope_free(int64_t id);
// Push / pop on the calling thread. Exits must mirror entries (RuntimeError otherwise). An exit
// pops its entry when it is on top of the thread's debug info; under something pushed since and
// still there (a profiler started in the block) it marks it exited instead, and the entry comes
// off at a later exit. Entries of other kinds are never touched, so the profiler keeps its state.
void scope_enter(int64_t id);
void scope_exit(int64_t id);
// The scope's counters since the last drain; nullopt for an unknown id.
std::optional<StatsTotals> scope_drain(int64_t id);

// Counts one executed call: in the active scope's counters, else the direct ops' counters.
void record_call(CountedOp op, const CallResult& counts, int64_t nanoseconds);

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace npu_dispatch
