// The one-pass plan split across threads, for lists long enough to repay it, on the direct entry
// (npu_dispatch.foreach_copy_ called from Python; planner/copy_call.cpp says why not below the
// dispatcher). One OpenMP region:
// each thread checks its share of the pairs (OnePass::prepare on pairs [b, e)), the shares'
// spans are compared with each other, and, where the call is small enough to copy with the GIL
// held, the threads copy its bytes split evenly between them. Per-pair work (reading and
// checking 2n tensors) is what bounds the one-pass plan on lists of small tensors; one thread did it
// all before while the other waited for the copy.
//
// Same outcome as one OnePass over the whole list: the same calls refused, the same error
// raised (on the calling thread) for the same pair, the same CallResult, warnings issued in
// pair order. Nothing is written unless every pair passes. One difference: the shares check
// pairs one pass would not have reached, and StorageImpl::mutable_data's warning on a flagged
// destination (a TORCH_WARN_ONCE, the only warning the checks can meet) met there comes out with
// this call, where stock issues it when a call first reaches that pair (maybe never); dropping it
// would lose it to the process, its once spent on the worker.
#pragma once

#include <c10/core/TensorImpl.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <exception>
#include <vector>

#include "planner/capability_table.h"
#include "planner/classify.h"
#include "planner/one_pass.h"

namespace npu_dispatch {

// Calls the threaded checks have taken (copied or prepared) since load; each counts in
// one_pass_calls() too.
int64_t threaded_check_calls();

class ThreadedChecks {
 public:
  // Whether a call of `n` pairs takes this one-pass plan: built with OpenMP, more than one thread, not
  // already inside a parallel region, and n >= 96 pairs.
  static bool wanted(size_t n);

  enum class Outcome { Refused, Prepared, Copied };
  // Refused: nothing written, the planner decides. Prepared: every pair passed; the bytes are
  // above `max_region_bytes`, so run() copies them (after the caller drops the GIL), and the
  // caller bumps the versions. Copied: done, every destination's version counter moved as stock
  // moves it (planner/classify.h stock_bumps_pair), each after its bytes were written;
  // counts() holds the CallResult. Raises what OnePass::prepare raises for
  // the first such pair, as it would.
  Outcome prepare(c10::TensorImpl* const* dsts, c10::TensorImpl* const* srcs, size_t n,
                  const CapabilityTable& caps, const RuleContext& rule, int64_t max_region_bytes);
  // Destination bytes (after Prepared or Copied).
  int64_t bytes() const { return bytes_; }
  // After Prepared: copies every pair (at::parallel_for over the destination bytes).
  CallResult run();
  const CallResult& counts() const { return counts_; }

 private:
  // What every thread of the region decides once the shares are checked.
  struct alignas(64) Plan {
    bool go = false;          // every pair passed, no spans of two shares met: copy
    bool meets = false;       // spans of two shares met
    bool own_shares = false;  // each thread copies (and bumps) the pairs it checked
    bool too_many_groups = false;  // more dtype pairs than kMaxGroups: refused
    size_t refused_at = SIZE_MAX;  // a run joined across storages at this pair: refused
    int64_t runs = 0, tensors = 0, coalesced_bytes = 0, empty = 0;
    std::vector<OnePass::Group> groups;
    std::vector<int64_t> offsets;  // destination bytes before each share's
    int64_t bytes = 0, moved = 0;  // destination bytes; bytes read plus written
    bool stream = false;  // streams() (cpu/byte_pass.h) of the shares' bytes moved together
    // Capacity for `shares` offsets and `max_groups` groups (join() refuses past that many rather
    // than allocate); allocates only on a one-pass plan's first call.
    void reserve(size_t shares, size_t max_groups);
    // Back to a fresh plan, keeping the lists' storage (no allocation).
    void reset();
  };
  // What one thread's checks met.
  struct alignas(64) ShareResult {
    int64_t streamed = 0;  // bytes this thread stored with streaming stores
    bool ok = false;
    size_t stop = SIZE_MAX;    // the pair this share stopped at (OnePass::stopped_at)
    std::exception_ptr error;  // what that pair raised
    std::vector<c10::Warning> warnings;
    void reset();
  };
  // Joins runs that meet at share boundaries, as one pass would have built them, into `p`'s
  // counts; sets `refused_at` where such a join crosses storages (one pass refuses that pair).
  // Shares [0, passed) passed every pair; share `passed` (if below `shares`) stopped at one:
  // only the boundary before it is tested. The counts mean something only when every share
  // passed.
  void join(size_t shares, size_t passed, Plan* p) const;
  // After the copy (in the region or in run()): the one-pass plan's counter, and counts_.
  void count_copied();
  // Work items of the shares.
  int64_t items() const;
  // Copies destination bytes [begin, end) of the shares laid end to end at `offsets`; with
  // `backward`, last item first (CpuCopyBatch::alternate); `stream` and the result as
  // CpuCopyBatch::copy_bytes.
  int64_t copy_share(const std::vector<int64_t>& offsets, int64_t begin, int64_t end, bool backward,
                  bool stream) const;

  // One share per thread, each on its own cache lines: the one-pass plan writes its members per pair.
  struct alignas(64) Share {
    OnePass pass;
  };
  // Kept from call to call (the entry keeps one pass per calling thread): shares_[0, team_) are
  // the last region's.
  std::vector<Share> shares_;
  std::vector<ShareResult> results_;
  std::vector<Plan> plans_;
  size_t team_ = 0;
  std::vector<int64_t> offsets_;  // destination bytes before each share's
  int64_t bytes_ = 0, moved_ = 0;
  // The joined counts (OnePass's, over the whole list).
  int64_t runs_ = 0, tensors_ = 0, coalesced_bytes_ = 0, empty_ = 0;
  std::vector<OnePass::Group> groups_;
  CallResult counts_;
};

}  // namespace npu_dispatch
