#include "sharded_lane.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

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

// Below this many pairs the region's start and its barriers (about 0.5 us here) cost more than
// half the per-pair work saves.
constexpr size_t kShardedPairs = 96;
// As cpu_copy_kernel.cpp: destination bytes one thread takes at least.
constexpr int64_t kGrainBytes = 64 * 1024;

// A share's warnings (StorageImpl::mutable_data may warn), tagged with the pair that issued them;
// the calling thread issues those a single lane would have issued, in pair order.
class WarningLog : public c10::WarningHandler {
 public:
  explicit WarningLog(const FastLane* lane) : lane_(lane) {}
  void process(const c10::Warning& w) override { items.emplace_back(lane_->stopped_at(), w); }
  std::vector<std::pair<size_t, c10::Warning>> items;

 private:
  const FastLane* lane_;
};

struct alignas(64) ShareResult {
  bool ok = false;
  bool meets_other = false;  // a span of this share meets another share's destination span
  size_t stop = SIZE_MAX;    // the pair this share stopped at (FastLane::stopped_at)
  std::exception_ptr error;  // what that pair raised
  std::vector<std::pair<size_t, c10::Warning>> warnings;
};

std::atomic<int64_t> g_sharded_calls{0};

}  // namespace

int64_t sharded_lane_calls() { return g_sharded_calls.load(std::memory_order_relaxed); }

bool ShardedLane::wanted(size_t n) {
#ifdef _OPENMP
  return n >= kShardedPairs && at::get_num_threads() > 1 && !at::in_parallel_region();
#else
  (void)n;
  return false;
#endif
}

void ShardedLane::copy_share(int64_t begin, int64_t end) {
  for (size_t s = 0; s < shares_.size(); ++s) {
    const int64_t off = offsets_[s];
    const int64_t lo = std::max(begin, off);
    const int64_t hi = std::min(end, off + shares_[s].lane.batch().total_bytes());
    if (lo < hi) shares_[s].lane.batch().copy_bytes(lo - off, hi - off);
  }
}

bool ShardedLane::join_boundaries(size_t shares, size_t ok, size_t* refused) {
  runs_ = tensors_ = coalesced_bytes_ = empty_ = 0;
  groups_.clear();
  auto group = [&](uint16_t dtypes) -> FastLane::Group& {
    for (auto& g : groups_) {
      if (g.dtypes == dtypes) return g;
    }
    groups_.push_back({dtypes, 0, 0});
    return groups_.back();
  };
  // One lane counts a run of two or more as coalesced, a run of one in its dtype pair's group.
  auto add = [&](const LaneRun& r, int64_t sign) {
    if (r.len >= 2) {
      runs_ += sign;
      tensors_ += sign * r.len;
      coalesced_bytes_ += sign * r.bytes;
    } else {
      auto& g = group(r.dtypes);
      g.tensors += sign;
      g.bytes += sign * r.bytes;
    }
  };
  for (size_t s = 0; s < ok; ++s) {
    const FastLane& l = shares_[s].lane;
    runs_ += l.coalesced_runs();
    tensors_ += l.coalesced_tensors();
    coalesced_bytes_ += l.coalesced_bytes();
    empty_ += l.empty_pairs();
    for (const auto& g : l.groups()) {
      auto& mine = group(g.dtypes);
      mine.tensors += g.tensors;
      mine.bytes += g.bytes;
    }
  }
  bool have = false;  // `carried`: the last run so far, as counted
  LaneRun carried;
  for (size_t s = 0; s < shares && s <= ok; ++s) {
    const FastLane& l = shares_[s].lane;
    if (l.runs_opened() == 0) continue;  // only empty pairs: the run before goes on
    const LaneRun& h = l.head();
    if (have && h.dtypes == carried.dtypes && h.dst == carried.dst_end && h.src == carried.src_end) {
      // plan.cpp coalesces only inside one storage; one lane refuses this pair.
      if (h.dst_storage != carried.dst_storage || h.src_storage != carried.src_storage) {
        *refused = h.first_pair;
        return false;
      }
      if (s == ok) break;
      LaneRun joined = carried;
      joined.len += h.len;
      joined.bytes += h.bytes;
      joined.dst_end = h.dst_end;
      joined.src_end = h.src_end;
      add(carried, -1);
      add(h, -1);
      add(joined, 1);
      carried = l.runs_opened() == 1 ? joined : l.tail();
    } else {
      if (s == ok) break;
      carried = l.tail();
    }
    have = true;
  }
  return true;
}

ShardedLane::Outcome ShardedLane::prepare(c10::TensorImpl* const* dsts, c10::TensorImpl* const* srcs,
                                          size_t n, const CapabilityTable& caps, bool grad_check,
                                          int64_t max_region_bytes, bool bump) {
#ifndef _OPENMP
  (void)dsts, (void)srcs, (void)n, (void)caps, (void)grad_check, (void)max_region_bytes, (void)bump;
  return Outcome::Refused;
#else
  const int threads = at::get_num_threads();
  shares_.clear();
  shares_.resize(threads);  // constructed here, on the calling thread (CpuCopyBatch reads its thread count)
  offsets_.assign(threads, 0);
  std::vector<ShareResult> results(threads);  // each on its own cache lines (alignas)
  int team = 1;
  // Set by the master thread between the barriers, read by all after the second.
  bool joined = false, copy_here = false;
  size_t refused_at = SIZE_MAX;
  std::exception_ptr join_error;
  // Profiler ranges, opened and closed on the calling thread (the master), around the copy.
  std::optional<at::RecordFunction> rf_coalesced, rf_foreach, rf_kernel;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    const size_t b = n * t / nt, e = n * (t + 1) / nt;
    FastLane& lane = shares_[t].lane;
    ShareResult& r = results[t];
    lane.set_first_pair(b);
    {
      WarningLog log(&lane);
      c10::WarningUtils::WarningHandlerGuard guard(&log);
      try {
        r.ok = lane.prepare(dsts + b, srcs + b, e - b, caps, grad_check);
        if (r.ok) lane.batch().finish();
      } catch (...) {
        r.ok = false;
        r.error = std::current_exception();
      }
      r.stop = lane.stopped_at();
      r.warnings = std::move(log.items);
    }
#pragma omp barrier
    bool all_ok = true;
    for (int u = 0; u < nt; ++u) all_ok = all_ok && results[u].ok;
    if (all_ok) {
      // Each share's own spans were compared inside it; here its sources and destinations meet
      // the other shares' destinations (each pair of shares' destinations once).
      try {
        for (int u = 0; u < nt && !r.meets_other; ++u) {
          if (u == t) continue;
          r.meets_other = FastLane::meets(shares_[u].lane.dst_spans(), lane.src_spans()) ||
                          (u > t && FastLane::meets(shares_[u].lane.dst_spans(), lane.dst_spans()));
        }
      } catch (...) {
        r.meets_other = true;  // no memory for the comparison: the planner decides
      }
    }
#pragma omp master
    {
      team = nt;
      try {
        size_t ok = 0;
        while (ok < static_cast<size_t>(nt) && results[ok].ok) ++ok;
        joined = join_boundaries(static_cast<size_t>(nt), ok, &refused_at);
        if (joined && all_ok) {
          int64_t off = 0;
          for (int u = 0; u < nt; ++u) {
            offsets_[u] = off;
            off += shares_[u].lane.batch().total_bytes();
          }
          bytes_ = off;
        }
      } catch (...) {
        join_error = std::current_exception();
      }
    }
#pragma omp barrier
    bool go = all_ok && joined && !join_error;
    for (int u = 0; u < nt && go; ++u) go = !results[u].meets_other;
    if (go && bytes_ <= max_region_bytes) {
#pragma omp master
      try {
        copy_here = true;
        rf_coalesced.emplace(at::RecordScope::FUNCTION);
        if (runs_ > 0 && rf_coalesced->isActive()) rf_coalesced->before("npu_dispatch::coalesced");
        rf_foreach.emplace(at::RecordScope::FUNCTION);
        if (!groups_.empty() && rf_foreach->isActive()) rf_foreach->before("npu_dispatch::foreach");
        rf_kernel.emplace(at::RecordScope::FUNCTION);
        if (rf_kernel->isActive()) rf_kernel->before("npu_dispatch::cpu_kernel");
      } catch (...) {
        // Profiler ranges only: the copy goes on without them.
      }
      copy_share(bytes_ * t / nt, bytes_ * (t + 1) / nt);
      if (bump) {
        // No version moves before every byte is written (stock bumps a pair after its copy).
#pragma omp barrier
        if (runs_ == 0) {
          for (size_t i = b; i < e; ++i) dsts[i]->bump_version();
        } else {
          // Coalesced runs are views of one base, sharing its counter: one thread bumps them
          // all rather than two fighting over that counter's cache line.
#pragma omp master
          for (size_t i = 0; i < n; ++i) dsts[i]->bump_version();
        }
      }
    }
  }
  rf_kernel.reset();
  rf_foreach.reset();
  rf_coalesced.reset();
  shares_.resize(team);
  offsets_.resize(team);

  // What one lane would have met first: a pair refused or raising (shares are in pair order),
  // or a join refused at a share's first run. Warnings up to and including that pair stand.
  size_t event = SIZE_MAX;
  std::exception_ptr error;
  for (int u = 0; u < team && event == SIZE_MAX; ++u) {
    if (!results[u].ok && results[u].stop != SIZE_MAX) {
      event = results[u].stop;
      error = results[u].error;
    }
  }
  if (refused_at < event) {
    event = refused_at;
    error = nullptr;
  }
  const size_t cut = event == SIZE_MAX ? n : event + 1;
  for (int u = 0; u < team; ++u) {
    for (const auto& w : results[u].warnings) {
      if (w.first < cut) c10::warn(w.second);
    }
  }
  if (error) std::rethrow_exception(error);
  if (event != SIZE_MAX) return Outcome::Refused;
  if (join_error) std::rethrow_exception(join_error);
  for (int u = 0; u < team; ++u) {
    // A share whose own spans met (stop SIZE_MAX), or whose spans met another's.
    if (!results[u].ok || results[u].meets_other) return Outcome::Refused;
  }
  g_sharded_calls.fetch_add(1, std::memory_order_relaxed);
  if (!copy_here) return Outcome::Prepared;
  int64_t items = 0;
  for (const auto& sh : shares_) items += static_cast<int64_t>(sh.lane.batch().size());
  CpuCopyBatch::count_pass(items, bytes_);
  count_lane_call();
  counts_ = lane_counts(runs_, tensors_, coalesced_bytes_, groups_, empty_, *shares_[0].lane.capability());
  return Outcome::Copied;
#endif
}

std::vector<int64_t> ShardedLane::run() {
  {
    at::RecordFunction coalesced(at::RecordScope::FUNCTION);
    if (runs_ > 0 && coalesced.isActive()) coalesced.before("npu_dispatch::coalesced");
    at::RecordFunction foreach_range(at::RecordScope::FUNCTION);
    if (!groups_.empty() && foreach_range.isActive()) foreach_range.before("npu_dispatch::foreach");
    RECORD_FUNCTION("npu_dispatch::cpu_kernel", std::vector<c10::IValue>());
    at::parallel_for(0, bytes_, kGrainBytes, [this](int64_t b, int64_t e) { copy_share(b, e); });
  }
  int64_t items = 0;
  for (const auto& sh : shares_) items += static_cast<int64_t>(sh.lane.batch().size());
  CpuCopyBatch::count_pass(items, bytes_);
  count_lane_call();
  counts_ = lane_counts(runs_, tensors_, coalesced_bytes_, groups_, empty_, *shares_[0].lane.capability());
  return counts_;
}

}  // namespace npu_dispatch
