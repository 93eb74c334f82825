// The planner's answer for the commonest call, found in one pass over the pairs: every pair an
// ordinary dense CPU tensor pair, contiguous, of one shape, of a dtype pair the CPU kernel copies
// exactly, with no memory shared between a destination and anything else. For such a call the
// full planner (planner/plan.cpp) would put every pair on the fast route with no fallback; the one-pass plan
// applies the same coalescing rule (planner/runs.h), so it builds the same runs and groups (and the
// same counts), without the planner's per-pair bookkeeping. Any
// other call is refused before anything is written, and the caller plans it in full.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstddef>
#include <vector>

#include "planner/capability_table.h"
#include "planner/classify.h"
#include "planner/execute.h"
#include "planner/runs.h"
#include "planner/spans.h"
#include "cpu/copy_kernel.h"

namespace npu_dispatch {

// Calls the one-pass plan has run since load (tests check which way a call went).
int64_t one_pass_calls();

class OnePass {
 public:
  // Reads metadata only (a copy-on-write destination, which asking for its pointer would copy,
  // is refused). Returns false when the call needs the full planner. `n` > 0 pairs. `rule`: the calling
  // thread's state the rule reads (planner/classify.h; with grad_check, a tensor that requires
  // grad is refused: the dispatcher's Autograd kernel must see the call).
  bool prepare(c10::TensorImpl* const* dsts, c10::TensorImpl* const* srcs, size_t n,
               const CapabilityTable& caps, const RuleContext& rule);
  // Destination bytes the kernel will write (decides whether the caller drops the GIL).
  int64_t bytes() const { return bytes_; }
  // Copies every pair in one kernel pass (`serial_moved_bytes` as CpuCopyBatch::run), inside the
  // executor's profiler ranges (planner/execute.cpp names them the same); returns the CallResult
  // (planner/execute.h). No version counter moves here.
  CallResult run(int64_t serial_moved_bytes = kSerialMovedBytes);

 private:
  // Ends the open run (planner/runs.h): a run of two or more pairs is counted, a single joins
  // its key's group.
  void close_run() {
    if (cursor_.len >= 2) {
      ++runs_;
      run_tensors_ += cursor_.len;
      coalesced_bytes_ += cursor_.dbytes;
    } else if (cursor_.len == 1) {
      const size_t g = group_of(keys_, cursor_.end.key, last_group_);
      if (g == groups_.size()) groups_.push_back({0, 0});
      groups_[g].tensors += 1;
      groups_[g].bytes += cursor_.dbytes;
    }
    cursor_.len = 0;
  }

  const Capability* cap_ = nullptr;
  CpuCopyBatch batch_;
  std::vector<Span> dst_spans_, src_spans_;
  // The groups of singles: their keys, and (tensors, bytes) of each.
  struct Group {
    int64_t tensors, bytes;
  };
  std::vector<uint32_t> keys_;
  std::vector<Group> groups_;
  size_t last_group_ = 0;
  RunCursor cursor_;
  int64_t runs_ = 0, run_tensors_ = 0, coalesced_bytes_ = 0;
  int64_t empty_ = 0, bytes_ = 0;
};

// One call of the one-pass plan by an entry that holds the pairs' TensorImpls
// (binding/direct_entry.cpp, planner/copy_call.cpp plan_and_run): the TensorImpl list, the plan,
// the copy and the version bumps stock's in-place op makes.
class OnePassCall {
 public:
  // `n` > 0 pairs. Uses the calling thread's kept TensorImpl list where it can.
  explicit OnePassCall(size_t n);
  ~OnePassCall();
  OnePassCall(const OnePassCall&) = delete;
  OnePassCall& operator=(const OnePassCall&) = delete;

  // 2n slots for the caller to fill: destinations, then sources. They must stay alive until
  // the call is done.
  c10::TensorImpl** impls() { return impls_->data(); }

  enum class Step { Refused, Copied, Prepared };
  // Refused: nothing written, the full planner decides. Copied: every pair copied, each
  // destination's version counter moved as stock moves it (planner/classify.h stock_bumps_pair).
  // Prepared: every pair passed and more than `max_held_bytes` bytes wait for copy() (the
  // caller drops the GIL first). With `grad_check` (grad mode on, the dispatcher bypassed), a
  // tensor that requires grad is refused. `bump` false: no counter moves (as below
  // ADInplaceOrView). `serial_moved_bytes`: the copy stays on the calling thread up to that many
  // bytes read plus written (CpuCopyBatch::run). Raises what OnePass::prepare raises, nothing
  // written.
  Step prepare(const CapabilityTable& caps, bool grad_check, int64_t max_held_bytes, bool bump = true,
               int64_t serial_moved_bytes = kSerialMovedBytes);
  // After Prepared: copies (and bumps, as prepare() was told).
  void copy();
  // After Copied, or Prepared and copy(): the CallResult (planner/execute.h).
  const CallResult& counts() const { return counts_; }

 private:
  size_t n_;
  bool* taken_ = nullptr;
  std::vector<c10::TensorImpl*> own_impls_;
  std::vector<c10::TensorImpl*>* impls_ = nullptr;
  OnePass one_pass_;
  bool bump_ = true;
  int64_t serial_moved_bytes_ = kSerialMovedBytes;
  CallResult counts_;
};

}  // namespace npu_dispatch
