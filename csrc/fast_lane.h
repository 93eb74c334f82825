// The planner's answer for the commonest call, found in one pass over the pairs: every pair an
// ordinary dense CPU tensor pair, contiguous, of one shape, of a dtype pair the CPU kernel copies
// exactly, with no memory shared between a destination and anything else. For such a call the
// full planner (plan.cpp) would put every pair on the fast route with no fallback; the lane
// builds the same runs and groups (and the same counts) without its per-pair bookkeeping. Any
// other call is refused before anything is written, and the caller plans it in full.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "capability_table.h"
#include "cpu_copy_kernel.h"

namespace npu_dispatch {

// Calls the lane has run since load (tests check which way a call went).
int64_t fast_lane_calls();

class FastLane {
 public:
  // Reads metadata only (and materializes copy-on-write destinations, as the planner does).
  // Returns false when the call needs the full planner. `n` > 0 pairs. With `grad_check`, a
  // tensor that requires grad is refused too (grad mode is on and the caller bypassed the
  // dispatcher, whose Autograd kernel must see the call).
  bool prepare(c10::TensorImpl* const* dsts, c10::TensorImpl* const* srcs, size_t n,
               const CapabilityTable& caps, bool grad_check);
  bool prepare(at::TensorList dsts, at::TensorList srcs, const CapabilityTable& caps);
  // Destination bytes the kernel will write (decides whether the caller drops the GIL).
  int64_t bytes() const { return bytes_; }
  // Copies every pair in one kernel pass; returns the count vector of execute.h. No version
  // counter moves here.
  std::vector<int64_t> run();

 private:
  struct Span {
    uintptr_t start, end;
  };
  struct Group {
    uint16_t dtypes;  // dtype_pair()
    int64_t tensors, bytes;
  };
  // Ends the run being built. A single that joins the last group hit (the common case: one
  // dtype pair per list) stays inline; the rest is close_run_slow.
  void close_run() {
    if (run_len_ == 1 && last_group_ < groups_.size() && groups_[last_group_].dtypes == run_dtypes_) {
      groups_[last_group_].tensors += 1;
      groups_[last_group_].bytes += run_bytes_;
      run_len_ = 0;
      return;
    }
    close_run_slow();
  }
  void close_run_slow();
  bool disjoint();

  const Capability* cap_ = nullptr;
  CpuCopyBatch batch_;
  std::vector<Span> dst_spans_, src_spans_;
  std::vector<Group> groups_;
  size_t last_group_ = 0;
  // The run being built: adjacent contiguous pairs of one dtype pair in one storage each.
  int64_t run_len_ = 0, run_bytes_ = 0;
  uint16_t run_dtypes_ = 0;  // dtype_pair(src, dst) of the run
  int64_t runs_ = 0, run_tensors_ = 0, coalesced_bytes_ = 0;
  int64_t empty_ = 0, bytes_ = 0;
};

}  // namespace npu_dispatch
