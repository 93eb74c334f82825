#include "planner/one_pass_call.h"

#include <c10/core/InferenceMode.h>

#include "planner/classify.h"


namespace npu_dispatch {

// What a call allocates (the TensorImpl list, the threaded checks' shares), kept per calling
// thread from call to call: about a microsecond of allocations less on a call of 200 pairs. A
// call while the thread's scratch is taken (none is known: warnings reach Python only after the
// call returns) or a list of more than kKeptPairs pairs gets a fresh one, so a thread keeps
// about a kKeptPairs-pair list's worth at most (a little more where FBGEMM splits pairs into
// chunks), until it exits.
struct OnePassCall::Scratch {
  std::vector<c10::TensorImpl*> impls;
  ThreadedChecks threaded;
};


OnePassCall::OnePassCall(size_t n) : n_(n) {
  static thread_local Scratch kept;
  static thread_local bool taken = false;
  if (n <= kKeptPairs && !taken) {
    taken = true;
    taken_ = &taken;
    impls_ = &kept.impls;
    threaded_ = &kept.threaded;
  } else {
    own_impls_.emplace();
    own_threads_.emplace();
    impls_ = &*own_impls_;
    threaded_ = &*own_threads_;
  }
  impls_->resize(2 * n);
}

OnePassCall::~OnePassCall() {
  if (taken_ != nullptr) *taken_ = false;
}

OnePassCall::Step OnePassCall::prepare(const CapabilityTable& caps, bool grad_check, int64_t max_held_bytes,
                                 bool threads, bool bump, int64_t serial_moved_bytes) {
  const RuleContext rule = RuleContext::here(grad_check);
  TORCH_INTERNAL_ASSERT(bump || !threads, "the threaded checks always bump");
  bump_ = bump;
  serial_moved_bytes_ = serial_moved_bytes;
  c10::TensorImpl* const* d = impls_->data();
  c10::TensorImpl* const* s = d + n_;
  if (threads && ThreadedChecks::wanted(n_)) {
    // Checks split across threads; a call under `max_held_bytes` is copied in the same region.
    use_threads_ = true;
    switch (threaded_->prepare(d, s, n_, caps, rule, max_held_bytes)) {
      case ThreadedChecks::Outcome::Refused:
        return Step::Refused;
      case ThreadedChecks::Outcome::Copied:  // bumped too
        counts_ = threaded_->counts();
        return Step::Copied;
      case ThreadedChecks::Outcome::Prepared:
        return Step::Prepared;
    }
  }
  one_pass_.emplace();
  if (!one_pass_->prepare(d, s, n_, caps, rule)) return Step::Refused;
  if (one_pass_->bytes() > max_held_bytes) return Step::Prepared;
  counts_ = one_pass_->run(serial_moved_bytes_);
  bump_all();
  return Step::Copied;
}

void OnePassCall::copy() {
  counts_ = use_threads_ ? threaded_->run() : one_pass_->run(serial_moved_bytes_);
  bump_all();
}

// Each listed destination's bump, as stock's in-place op moves it (planner/classify.h
// stock_bumps_pair: inside inference mode, not a pair of two inference tensors).
void OnePassCall::bump_all() {
  if (!bump_) return;
  c10::TensorImpl* const* d = impls_->data();
  const bool in_inference = c10::InferenceMode::is_enabled();
  for (size_t i = 0; i < n_; ++i) {
    if (stock_bumps_pair(*d[i], *d[n_ + i], in_inference)) d[i]->bump_version();
  }
}

}  // namespace npu_dispatch
