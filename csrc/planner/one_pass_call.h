// One call of the one-pass plan, the planner's first pass, by an entry that holds the pairs'
// TensorImpls (binding/direct_entry.cpp, planner/copy_call.cpp plan_and_run):
// the calling thread's scratch, the one-pass plan (its checks threaded for long lists), the copy and the version
// bumps stock's in-place op makes.
#pragma once

#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "planner/capability_table.h"
#include "planner/one_pass.h"
#include "planner/threaded_checks.h"

namespace npu_dispatch {

class OnePassCall {
 public:
  // `n` > 0 pairs. Leases the calling thread's scratch (lists up to kKeptPairs pairs, when no
  // other OnePassCall of this thread holds it), else allocates its own.
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
  // Prepared: every pair passed and more than `max_held_bytes` bytes wait for copy(). With
  // `grad_check` (grad mode on, the dispatcher bypassed), a tensor that requires grad is refused.
  // Raises what OnePass::prepare raises, nothing written.
  // `threads`: lists of ThreadedChecks::wanted() length take the threaded checks (planner/copy_call.cpp says why
  // calls through the dispatcher do not). `bump`: move each destination's version counter as stock does after
  // the copy (false: none moves, as below ADInplaceOrView; the threaded checks always bump, so this
  // needs `threads` false). `serial_moved_bytes`: the one-thread one-pass plan's copy stays on the calling
  // thread up to that many bytes read plus written (CpuCopyBatch::run).
  Step prepare(const CapabilityTable& caps, bool grad_check, int64_t max_held_bytes, bool threads = true,
               bool bump = true, int64_t serial_moved_bytes = kSerialMovedBytes);
  // After Prepared: copies (and bumps, as prepare() was told).
  void copy();
  // After Copied, or Prepared and copy(): the CallResult (planner/execute.h).
  const CallResult& counts() const { return counts_; }

 private:
  struct Scratch;
  void bump_all();

  size_t n_;
  Scratch* scratch_ = nullptr;
  bool* taken_ = nullptr;
  std::optional<std::vector<c10::TensorImpl*>> own_impls_;
  std::optional<ThreadedChecks> own_threads_;
  std::vector<c10::TensorImpl*>* impls_ = nullptr;
  ThreadedChecks* threaded_ = nullptr;
  std::optional<OnePass> one_pass_;
  bool use_threads_ = false;
  bool bump_ = true;
  int64_t serial_moved_bytes_ = kSerialMovedBytes;
  CallResult counts_;
};

}  // namespace npu_dispatch
