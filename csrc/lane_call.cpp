#include "lane_call.h"


namespace npu_dispatch {

// What a call allocates (the TensorImpl list, the sharded lane's shares), kept per calling
// thread from call to call: about a microsecond of allocations less on a call of 200 pairs. A
// call while the thread's scratch is taken (none is known: warnings reach Python only after the
// call returns) or a list of more than kKeptPairs pairs gets a fresh one, so a thread keeps
// about a kKeptPairs-pair list's worth at most (a little more where FBGEMM splits pairs into
// chunks), until it exits.
struct LaneCall::Scratch {
  std::vector<c10::TensorImpl*> impls;
  ShardedLane sharded;
};


LaneCall::LaneCall(size_t n) : n_(n) {
  static thread_local Scratch kept;
  static thread_local bool taken = false;
  if (n <= kKeptPairs && !taken) {
    taken = true;
    taken_ = &taken;
    impls_ = &kept.impls;
    sharded_ = &kept.sharded;
  } else {
    own_impls_.emplace();
    own_sharded_.emplace();
    impls_ = &*own_impls_;
    sharded_ = &*own_sharded_;
  }
  impls_->resize(2 * n);
}

LaneCall::~LaneCall() {
  if (taken_ != nullptr) *taken_ = false;
}

LaneCall::Step LaneCall::prepare(const CapabilityTable& caps, bool grad_check, int64_t max_held_bytes,
                                 bool shard, bool bump, int64_t serial_moved_bytes) {
  TORCH_INTERNAL_ASSERT(bump || !shard, "the sharded lane always bumps");
  bump_ = bump;
  serial_moved_bytes_ = serial_moved_bytes;
  c10::TensorImpl* const* d = impls_->data();
  c10::TensorImpl* const* s = d + n_;
  if (shard && ShardedLane::wanted(n_)) {
    // Checks split across threads; a call under `max_held_bytes` is copied in the same region.
    use_sharded_ = true;
    switch (sharded_->prepare(d, s, n_, caps, grad_check, max_held_bytes)) {
      case ShardedLane::Outcome::Refused:
        return Step::Refused;
      case ShardedLane::Outcome::Copied:  // bumped too
        counts_ = sharded_->counts();
        return Step::Copied;
      case ShardedLane::Outcome::Prepared:
        return Step::Prepared;
    }
  }
  lane_.emplace();
  if (!lane_->prepare(d, s, n_, caps, grad_check)) return Step::Refused;
  if (lane_->bytes() > max_held_bytes) return Step::Prepared;
  counts_ = lane_->run(serial_moved_bytes_);
  bump_all();
  return Step::Copied;
}

void LaneCall::copy() {
  counts_ = use_sharded_ ? sharded_->run() : lane_->run(serial_moved_bytes_);
  bump_all();
}

// One bump per listed destination, as stock's in-place op (the lane took only destinations
// with a version counter).
void LaneCall::bump_all() {
  if (!bump_) return;
  c10::TensorImpl* const* d = impls_->data();
  for (size_t i = 0; i < n_; ++i) d[i]->bump_version();
}

}  // namespace npu_dispatch
