// One call of the fast lane by an entry that holds the pairs' TensorImpls and answers for the
// context itself (csrc/python_entry.cpp's direct entry, csrc/mode_route.cpp's dispatch route):
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

// Above this many destination bytes the direct entry's copy drops the GIL (and then holds
// references to the list items, which another thread may take out of the lists meanwhile).
// Below it the pass holds the GIL under a millisecond on the CI machine: 18 to 95 us for just
// under 2 MB written to warm memory, up to about 1 ms for a first write to fresh pages on one
// thread, against Python's 5 ms switch interval. Dropping it costs about 1 us for 200 pairs (a
// reference taken and released per list item).
constexpr int64_t kReleaseGilBytes = 2 * 1024 * 1024;

// The thread's dispatch keys leave the call to the kernel: none switched on beyond the usual
// ones (with `under_mode`, also the two a dispatch mode switches on), so no functorch layer of
// the calling frame or JIT tracer (its Tracer key) would act on it; with `under_mode`, Python not
// excluded (torch._C._DisableTorchDispatch: the mode would not see the call either); and
// ADInplaceOrView not excluded. Below ADInplaceOrView (torch._C._AutoDispatchBelowADInplaceOrView)
// stock's copy_ loop bumps no version counter: with `bumps`, such a call passes and *bumps is set
// to false (true otherwise); without it, the general path decides there. Autocast is switched on
// by removing its keys from the excluded set, and its kernels fall through for _foreach_copy_.
bool lane_keys_plain(bool under_mode, bool* bumps = nullptr);

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
  // `shard`: lists of ShardedLane::wanted() length take the sharded lane (see mode_route.cpp for
  // a caller that should not). `bump`: move each destination's version counter once after the
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
