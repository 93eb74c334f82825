// The planner's answer for the commonest call, found in one pass over the pairs: every pair an
// ordinary dense CPU tensor pair, contiguous, of one shape, of a dtype pair the CPU kernel copies
// exactly, with no memory shared between a destination and anything else. For such a call the
// full planner (planner/plan.cpp) would put every pair on the fast route with no fallback; the one-pass plan
// builds the same runs and groups (and the same counts) without its per-pair bookkeeping. Any
// other call is refused before anything is written, and the caller plans it in full.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>

#include <cstdint>
#include <cstddef>
#include <vector>

#include "planner/capability_table.h"
#include "planner/classify.h"
#include "planner/execute.h"
#include "planner/spans.h"
#include "cpu/copy_kernel.h"

namespace npu_dispatch {

// Calls the one-pass plan has run since load (tests check which way a call went).
int64_t one_pass_calls();

// A run of the one-pass plan: adjacent contiguous pairs of one dtype pair in one storage each (a single
// pair is a run of one). The threaded checks join runs that meet at a share boundary.
struct OnePassRun {
  int64_t len = 0, bytes = 0;
  uint16_t dtypes = 0;
  uintptr_t dst = 0, src = 0, dst_end = 0, src_end = 0;
  const c10::StorageImpl* dst_storage = nullptr;
  const c10::StorageImpl* src_storage = nullptr;
  size_t first_pair = 0;  // index in the lists
};

class OnePass {
 public:
  // Reads metadata only (a copy-on-write destination, which asking for its pointer would copy,
  // is refused).
  // Returns false when the call needs the full planner. `n` > 0 pairs. `rule`: the calling
  // thread's state the rule reads (planner/classify.h; with grad_check, a tensor that requires
  // grad is refused: the dispatcher's Autograd kernel must see the call).
  bool prepare(c10::TensorImpl* const* dsts, c10::TensorImpl* const* srcs, size_t n,
               const CapabilityTable& caps, const RuleContext& rule);
  bool prepare(at::TensorList dsts, at::TensorList srcs, const CapabilityTable& caps);
  // Back to a fresh one-pass plan, keeping the lists' storage (the threaded checks reuse its shares);
  // `split_threads` as CpuCopyBatch::reset.
  void reset(int64_t split_threads);
  // Destination bytes the kernel will write (decides whether the caller drops the GIL).
  int64_t bytes() const { return bytes_; }

  // For the threaded checks (planner/threaded_checks.cpp), which runs prepare() on pairs [first, first + n)
  // of the lists on each thread. After a false prepare(): the pair it stopped at (index in the
  // lists), or SIZE_MAX where every pair passed and the spans met.
  size_t stopped_at() const { return stop_; }
  void set_first_pair(size_t first) { first_pair_ = first; }
  // Runs opened (0: every pair empty), the first and the last (the last as it stood when the
  // pairs ended), and the counts of what prepare() built.
  int64_t runs_opened() const { return runs_opened_; }
  const OnePassRun& head() const { return head_; }
  const OnePassRun& tail() const { return tail_; }
  // Destination spans sorted by address, source spans in pair order, and the hull of each list
  // (after a true prepare() with at least one non-empty pair).
  using Span = npu_dispatch::Span;  // planner/spans.h
  const std::vector<Span>& dst_spans() const { return dst_spans_; }
  const std::vector<Span>& src_spans() const { return src_spans_; }
  Span dst_hull() const { return dst_hull_; }
  Span src_hull() const { return src_hull_; }
  CpuCopyBatch& batch() { return batch_; }
  const CpuCopyBatch& batch() const { return batch_; }
  const Capability* capability() const { return cap_; }
  int64_t empty_pairs() const { return empty_; }
  int64_t coalesced_runs() const { return runs_; }
  int64_t coalesced_tensors() const { return run_tensors_; }
  int64_t coalesced_bytes() const { return coalesced_bytes_; }
  // (dtype pair, tensors, bytes) of each group of singles.
  struct Group {
    uint16_t dtypes;  // dtype_pair()
    int64_t tensors, bytes;
  };
  const std::vector<Group>& groups() const { return groups_; }
  // Copies every pair in one kernel pass (`serial_moved_bytes` as CpuCopyBatch::run); returns
  // the CallResult (planner/execute.h). No version counter moves here.
  CallResult run(int64_t serial_moved_bytes = kSerialMovedBytes);

 private:
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
  // The run being built, as it stands.
  OnePassRun current_run() const {
    OnePassRun r = run_;
    r.len = run_len_;
    r.bytes = run_bytes_;
    r.dtypes = run_dtypes_;
    r.dst_end = dst_spans_.back().end;
    r.src_end = src_spans_.back().end;
    return r;
  }

  const Capability* cap_ = nullptr;
  CpuCopyBatch batch_;
  std::vector<Span> dst_spans_, src_spans_;
  Span dst_hull_{0, 0}, src_hull_{0, 0};
  std::vector<Group> groups_;
  size_t last_group_ = 0;
  // The run being built: adjacent contiguous pairs of one dtype pair in one storage each.
  int64_t run_len_ = 0, run_bytes_ = 0;
  uint16_t run_dtypes_ = 0;  // dtype_pair(src, dst) of the run
  int64_t runs_ = 0, run_tensors_ = 0, coalesced_bytes_ = 0;
  int64_t empty_ = 0, bytes_ = 0;
  size_t first_pair_ = 0, stop_ = SIZE_MAX;
  int64_t runs_opened_ = 0;
  OnePassRun run_, head_, tail_;  // run_: where the run being built starts
};

// The executor's profiler ranges around one kernel pass (planner/execute.cpp names them the same):
// coalesced runs, foreach groups, the kernel. Opened and closed on one thread.
class KernelRanges {
 public:
  KernelRanges(bool coalesced, bool foreach);

 private:
  at::RecordFunction coalesced_{at::RecordScope::FUNCTION};
  at::RecordFunction foreach_{at::RecordScope::FUNCTION};
  at::RecordFunction kernel_{at::RecordScope::FUNCTION};
};

// The CallResult (planner/execute.h) of a one-pass plan call (`groups` without empty ones), and the one-pass call
// counter both passes move.
CallResult one_pass_counts(int64_t runs, int64_t run_tensors, int64_t coalesced_bytes,
                           const std::vector<OnePass::Group>& groups, int64_t empty, const Capability& cap);
void count_one_pass_call();

}  // namespace npu_dispatch
