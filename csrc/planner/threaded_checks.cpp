#include "planner/threaded_checks.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include "cpu/byte_pass.h"
#include "cpu/stream_copy.h"
#include "planner/classify.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <optional>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace npu_dispatch {
namespace {

// Dtype pairs of singles one threaded call counts (lists hold one or two); more: the planner.
constexpr size_t kMaxGroups = 16;

// A share's warnings (StorageImpl::mutable_data may warn), kept for the calling thread, which
// issues every share's in turn: pair order.
class WarningLog : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override { items.push_back(w); }
  std::vector<c10::Warning> items;
};

std::atomic<int64_t> g_threaded_calls{0};

void bump_as_stock(c10::TensorImpl* d, const c10::TensorImpl* s, bool in_inference) {
  if (stock_bumps_pair(*d, *s, in_inference)) d->bump_version();
}

// A thread's range copied with `streamed` bytes of streaming stores: fenced before it counts as
// copied, and added to the thread's share.
template <typename ShareResult>
void fence_streamed(int64_t streamed, ShareResult* r) {
  if (streamed > 0) {
    stream_fence();
    r->streamed += streamed;
  }
}

}  // namespace

void ThreadedChecks::ShareResult::reset() {
  streamed = 0;
  ok = false;
  stop = SIZE_MAX;
  error = nullptr;
  warnings.clear();
}

void ThreadedChecks::Plan::reserve(size_t shares, size_t max_groups) {
  groups.reserve(max_groups);
  offsets.reserve(shares);
}

void ThreadedChecks::Plan::reset() {
  auto kept_groups = std::move(groups);
  auto kept_offsets = std::move(offsets);
  *this = Plan();
  kept_groups.clear();
  kept_offsets.clear();
  groups = std::move(kept_groups);
  offsets = std::move(kept_offsets);
}

int64_t threaded_check_calls() { return g_threaded_calls.load(std::memory_order_relaxed); }

bool ThreadedChecks::wanted(size_t n) {
#ifdef _OPENMP
  return n >= kThreadedChecksPairs && at::get_num_threads() > 1 && !at::in_parallel_region();
#else
  (void)n;
  return false;
#endif
}

int64_t ThreadedChecks::copy_share(const std::vector<int64_t>& offsets, int64_t begin, int64_t end, bool backward,
                                   bool stream) const {
  int64_t streamed = 0;
  const size_t n = offsets.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t s = backward ? n - 1 - k : k;
    const auto& batch = shares_[s].pass.batch();
    const int64_t off = offsets[s];
    const int64_t lo = std::max(begin, off);
    const int64_t hi = std::min(end, off + batch.total_bytes());
    if (lo < hi) streamed += batch.copy_bytes(lo - off, hi - off, backward, stream);
  }
  return streamed;
}

void ThreadedChecks::join(size_t shares, size_t passed, Plan* p) const {
  // At most kMaxGroups, whose capacity was reserved before the region (no allocation, so no
  // thread can fail where another goes on; the constant, not the capacity, so every thread
  // refuses alike); a list of more dtype pairs than that goes to the planner.
  auto group = [&](uint16_t dtypes) -> OnePass::Group& {
    for (auto& g : p->groups) {
      if (g.dtypes == dtypes) return g;
    }
    if (p->groups.size() >= kMaxGroups) {
      p->too_many_groups = true;
      return p->groups.front();
    }
    p->groups.push_back({dtypes, 0, 0});
    return p->groups.back();
  };
  // One pass counts a run of two or more as coalesced, a run of one in its dtype pair's group.
  auto add = [&](const OnePassRun& r, int64_t sign) {
    if (r.len >= 2) {
      p->runs += sign;
      p->tensors += sign * r.len;
      p->coalesced_bytes += sign * r.bytes;
    } else {
      auto& g = group(r.dtypes);
      g.tensors += sign;
      g.bytes += sign * r.bytes;
    }
  };
  for (size_t s = 0; s < passed; ++s) {
    const OnePass& l = shares_[s].pass;
    p->runs += l.coalesced_runs();
    p->tensors += l.coalesced_tensors();
    p->coalesced_bytes += l.coalesced_bytes();
    p->empty += l.empty_pairs();
    for (const auto& g : l.groups()) {
      auto& mine = group(g.dtypes);
      mine.tensors += g.tensors;
      mine.bytes += g.bytes;
    }
  }
  bool have = false;  // `carried`: the last run so far, as counted
  OnePassRun carried;
  for (size_t s = 0; s < shares && s <= passed; ++s) {
    const OnePass& l = shares_[s].pass;
    if (l.runs_opened() == 0) continue;  // only empty pairs: the run before goes on
    const OnePassRun& h = l.head();
    if (have && h.dtypes == carried.dtypes && h.dst == carried.dst_end && h.src == carried.src_end) {
      // planner/plan.cpp coalesces only inside one storage; one pass refuses this pair.
      if (h.dst_storage != carried.dst_storage || h.src_storage != carried.src_storage) {
        p->refused_at = h.first_pair;
        return;
      }
      if (s == passed) return;
      OnePassRun joined = carried;
      joined.len += h.len;
      joined.bytes += h.bytes;
      joined.dst_end = h.dst_end;
      joined.src_end = h.src_end;
      add(carried, -1);
      add(h, -1);
      add(joined, 1);
      carried = l.runs_opened() == 1 ? joined : l.tail();
    } else {
      if (s == passed) return;
      carried = l.tail();
    }
    have = true;
  }
}

ThreadedChecks::Outcome ThreadedChecks::prepare(c10::TensorImpl* const* dsts, c10::TensorImpl* const* srcs,
                                          size_t n, const CapabilityTable& caps, const RuleContext& rule,
                                          int64_t max_region_bytes) {
#ifndef _OPENMP
  (void)dsts, (void)srcs, (void)n, (void)caps, (void)rule, (void)max_region_bytes;
  return Outcome::Refused;
#else
  const int threads = at::get_num_threads();
  // FBGEMM's fp16 -> fp32 split follows the calling thread's count, not a worker's (1).
  const int64_t split_threads = CpuCopyBatch::caller_threads();
  // Storage kept from the last call; each thread resets its own share, result and plan in the
  // region, so their cache lines stay on that thread's core (on this VM a line fetched from the
  // other vCPU costs up to a few hundred ns in some stretches).
  if (shares_.size() < static_cast<size_t>(threads)) shares_.resize(threads);
  if (results_.size() < static_cast<size_t>(threads)) results_.resize(threads);
  if (plans_.size() < static_cast<size_t>(threads)) plans_.resize(threads);
  for (int t = 0; t < threads; ++t) {
    // Every thread decides on its own plan, from the same results, without allocating (they
    // must agree, with no barrier between deciding and copying): the capacity is reserved here,
    // where a failure raises before any thread starts. Kept from the last call, it reads only.
    plans_[t].reserve(threads, kMaxGroups);
  }
  // What the master's plan is copied into after the region: no allocation once bytes are written.
  groups_.reserve(kMaxGroups);
  offsets_.reserve(threads);
  int team = 1;
  bool copy_here = false;
  // The calling thread's InferenceMode (the workers do not carry it), as the rule read it.
  const bool in_inference = rule.in_inference;
  // Profiler ranges, opened and closed on the calling thread (the master), around the copy.
  std::optional<KernelRanges> ranges;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    const size_t b = n * t / nt, e = n * (t + 1) / nt;
    OnePass& pass = shares_[t].pass;
    ShareResult& r = results_[t];
    pass.reset(split_threads);
    r.reset();
    plans_[t].reset();
    pass.set_first_pair(b);
    {
      WarningLog log;
      c10::WarningUtils::WarningHandlerGuard guard(&log);
      try {
        r.ok = pass.prepare(dsts + b, srcs + b, e - b, caps, rule);
        if (r.ok) pass.batch().finish();
      } catch (...) {
        r.ok = false;
        r.error = std::current_exception();
      }
      r.stop = pass.stopped_at();
      r.warnings = std::move(log.items);
    }
#pragma omp barrier
    // Every thread reaches the same decision from the shares' results (cheaper here than a
    // second barrier to share one thread's).
    Plan& p = plans_[t];
    // Shares before `passed` passed every pair (their spans may still have met inside them: one
    // one-pass plan finds that only after its last pair, so the boundaries after them still count).
    size_t passed = 0;
    while (passed < static_cast<size_t>(nt) && results_[passed].stop == SIZE_MAX && !results_[passed].error) {
      ++passed;
    }
    bool all_ok = true;
    for (int u = 0; u < nt; ++u) all_ok = all_ok && results_[u].ok;
    join(static_cast<size_t>(nt), passed, &p);
    if (all_ok && p.refused_at == SIZE_MAX && !p.too_many_groups) {
      // Each share's own spans were compared inside it; here each share's sources and
      // destinations meet the other shares' destinations.
      for (int u = 0; u < nt && !p.meets; ++u) {
        for (int v = 0; v < nt && !p.meets; ++v) {
          if (u == v) continue;
          const OnePass& a = shares_[u].pass;
          const OnePass& c = shares_[v].pass;
          p.meets = meets(a.dst_spans(), a.dst_hull(), c.src_spans(), c.src_hull()) ||
                    (u < v && meets(a.dst_spans(), a.dst_hull(), c.dst_spans(), c.dst_hull()));
        }
      }
      int64_t largest = 0, moved = 0;
      for (int u = 0; u < nt; ++u) {
        p.offsets.push_back(p.bytes);  // reserved: no allocation
        p.bytes += shares_[u].pass.batch().total_bytes();
        moved += shares_[u].pass.batch().moved_bytes();
        largest = std::max(largest, shares_[u].pass.batch().total_bytes());
      }
      // The whole call's bytes decide, as one pass's pass would.
      p.stream = streams(moved);
      p.moved = moved;
      p.go = !p.meets;
      // Shares within a quarter of an even split copy their own pairs (no barrier before
      // their bumps); others split the bytes evenly. Coalesced runs are views of one base,
      // sharing its counter: one thread bumps them, after a barrier.
      p.own_shares = p.runs == 0 && largest * nt <= p.bytes + p.bytes / 4;
    }
    const bool go = p.go && p.bytes <= max_region_bytes;
#pragma omp master
    team = nt;
    if (go) {
#pragma omp master
      try {
        copy_here = true;
        bool singles = false;  // a group a join emptied opens no range, as in one pass
        for (const auto& g : p.groups) singles = singles || g.tensors > 0;
        ranges.emplace(p.runs > 0, singles);
      } catch (...) {
        // Profiler ranges only: the copy goes on without them.
      }
      if (p.own_shares) {
        // Each thread copies the pairs it checked, then moves their versions, as stock's loop
        // does pair by pair: no version moves before its destination's bytes are written.
        const auto& batch = pass.batch();
        fence_streamed(batch.copy_bytes(0, batch.total_bytes(), CpuCopyBatch::alternate(), p.stream), &r);
        for (size_t i = b; i < e; ++i) bump_as_stock(dsts[i], srcs[i], in_inference);
      } else {
        fence_streamed(copy_share(p.offsets, p.bytes * t / nt, p.bytes * (t + 1) / nt, CpuCopyBatch::alternate(), p.stream),
                       &r);
        // Every thread wrote bytes of other threads' pairs: no version moves before all are.
#pragma omp barrier
        if (p.runs == 0) {
          for (size_t i = b; i < e; ++i) bump_as_stock(dsts[i], srcs[i], in_inference);
        } else {
          // Coalesced runs are views of one base, sharing its counter: one thread bumps them
          // all rather than two fighting over that counter's cache line.
#pragma omp master
          for (size_t i = 0; i < n; ++i) bump_as_stock(dsts[i], srcs[i], in_inference);
        }
      }
    }
  }
  ranges.reset();
  team_ = static_cast<size_t>(team);
  Plan& plan = plans_[0];  // the master's
  runs_ = plan.runs;
  tensors_ = plan.tensors;
  coalesced_bytes_ = plan.coalesced_bytes;
  empty_ = plan.empty;
  groups_.assign(plan.groups.begin(), plan.groups.end());
  // A group a join emptied: one pass never had it (its profiler range, run()).
  groups_.erase(std::remove_if(groups_.begin(), groups_.end(), [](const OnePass::Group& g) { return g.tensors == 0; }),
                groups_.end());
  offsets_.assign(plan.offsets.begin(), plan.offsets.end());
  bytes_ = plan.bytes;
  moved_ = plan.moved;

  // What one pass would have met first: a pair refused or raising (shares are in pair order),
  // or a join refused at a share's first run. Warnings up to and including that pair stand.
  size_t event = SIZE_MAX;
  std::exception_ptr error;
  for (int u = 0; u < team && event == SIZE_MAX; ++u) {
    if (!results_[u].ok && results_[u].stop != SIZE_MAX) {
      event = results_[u].stop;
      error = results_[u].error;
    }
  }
  if (plan.refused_at < event) {
    event = plan.refused_at;
    error = nullptr;
  }
  // Every warning the shares met, in pair order. The only one they can meet is StorageImpl's
  // TORCH_WARN_ONCE on a flagged destination, and its once is spent wherever a share met it:
  // dropped here (at a pair past where one pass stops), it would be lost to the process.
  for (int u = 0; u < team; ++u) {
    for (const auto& w : results_[u].warnings) c10::warn(w);
  }
  if (error) std::rethrow_exception(error);
  if (event != SIZE_MAX) return Outcome::Refused;
  // A share whose own spans met (stop SIZE_MAX), or spans of two shares that met.
  if (!plan.go) return Outcome::Refused;
  g_threaded_calls.fetch_add(1, std::memory_order_relaxed);
  if (!copy_here) return Outcome::Prepared;
  int64_t streamed = 0;
  for (int u = 0; u < team; ++u) streamed += results_[u].streamed;
  count_pass(items(), bytes_, streamed);
  count_copied();
  return Outcome::Copied;
#endif
}

CallResult ThreadedChecks::run() {
  {
    KernelRanges ranges(runs_ > 0, !groups_.empty());
    // Always split: a call above the held bytes (OnePassCall::prepare) moves more than one thread should.
    byte_pass(bytes_, 1, moved_, items(), /*can_stream=*/true,
              [this](int64_t b, int64_t e, bool stream) {
                return copy_share(offsets_, b, e, CpuCopyBatch::alternate(), stream);
              },
              /*serial_moved_bytes=*/0);
  }
  count_copied();
  return counts_;
}

int64_t ThreadedChecks::items() const {
  int64_t items = 0;
  for (size_t u = 0; u < team_; ++u) items += static_cast<int64_t>(shares_[u].pass.batch().size());
  return items;
}

void ThreadedChecks::count_copied() {
  count_one_pass_call();
  counts_ = one_pass_counts(runs_, tensors_, coalesced_bytes_, groups_, empty_, *shares_[0].pass.capability());
}

}  // namespace npu_dispatch
