// One call of the fast lane, the planner's first pass, by an entry that holds the pairs'
// TensorImpls (csrc/python_entry.cpp's direct entry, copy_call.cpp plan_and_run):
// the calling thread's scratch, the lane (sharded for long lists), the copy and the version
// bumps stock's in-place op makes.
#pragma once

#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "capability_table.h"
#include "fast_lane.h"
#include "sharded_lane.h"

namespace npu_dispatch {

class LaneCall {
 public:
  // `n` > 0 pairs. Leases the calling thread's scratch (lists up to kKeptPairs pairs, when no
  // other LaneCall of this thread holds it), else allocates its own.
  explicit LaneCall(size_t n);
  ~LaneCall();
  LaneCall(const LaneCall&) = delete;
  LaneCall& operator=(const LaneCall&) = delete;

  // 2n slots for the caller to fill: destinations, then sources. They must stay alive until
  // the call is done.
  c10::TensorImpl** impls() { return impls_->data(); }

  enum class Step { Refused, Copied, Prepared };
  // Refused: nothing written, the full planner decides. Copied: every pair copied, each
  // destination's version counter moved once. Prepared: every pair passed and more than
  // `max_held_bytes` bytes wait for copy(). With `grad_check`, a tensor that requires grad is
  // refused. Raises what FastLane::prepare raises, nothing written.
  // `shard`: lists of ShardedLane::wanted() length take the sharded lane (copy_call.cpp says why
  // calls through the dispatcher do not). `bump`: move each destination's version counter once after the
  // copy (false: none moves, as below ADInplaceOrView; the sharded lane always bumps, so this
  // needs `shard` false). `serial_moved_bytes`: the one-thread lane's copy stays on the calling
  // thread up to that many bytes read plus written (CpuCopyBatch::run).
  Step prepare(const CapabilityTable& caps, bool grad_check, int64_t max_held_bytes, bool shard = true,
               bool bump = true, int64_t serial_moved_bytes = kSerialMovedBytes);
  // After Prepared: copies (and bumps, as prepare() was told).
  void copy();
  // After Copied, or Prepared and copy(): the count vector of execute.h.
  const std::vector<int64_t>& counts() const { return counts_; }

 private:
  struct Scratch;
  void bump_all();

  size_t n_;
  Scratch* scratch_ = nullptr;
  bool* taken_ = nullptr;
  std::optional<std::vector<c10::TensorImpl*>> own_impls_;
  std::optional<ShardedLane> own_sharded_;
  std::vector<c10::TensorImpl*>* impls_ = nullptr;
  ShardedLane* sharded_ = nullptr;
  std::optional<FastLane> lane_;
  bool use_sharded_ = false;
  bool bump_ = true;
  int64_t serial_moved_bytes_ = kSerialMovedBytes;
  std::vector<int64_t> counts_;
};

}  // namespace npu_dispatch
