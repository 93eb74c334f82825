// The copy planner (planner/plan.h): checks each pair in list order, so the first pair that sends a call
// to stock is the one stock's own loop would meet first; explain() decodes what it builds.
#include "planner/plan.h"
#include "planner/device_batching.h"
#include "planner/runs.h"
#include "planner/spans.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <tuple>

namespace npu_dispatch {
namespace {

int64_t span_bytes(const at::Tensor& t) {
  int64_t span = 0;
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  for (size_t k = 0; k < sizes.size(); ++k) {
    span += (sizes[k] - 1) * strides[k];
  }
  return (span + 1) * static_cast<int64_t>(t.element_size());
}

const c10::StorageImpl* storage_of(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
}

struct Interval {
  int64_t rank;  // the device's position in str(device) order, sorted by str(device)
  int64_t start, end, index;
  bool is_dst;
  auto key() const { return std::make_tuple(rank, start, end, index, is_dst); }
};

struct PairInfo {
  int64_t dptr = 0, sptr = 0;
  bool batched = false;  // PairClass::batched
};

class Planner {
 public:
  Planner(at::TensorList dsts, at::TensorList srcs, const CapabilityTable& caps, bool non_blocking)
      : dsts_(dsts), srcs_(srcs), caps_(caps), non_blocking_(non_blocking), info_(dsts.size()) {
    plan_.n = static_cast<int64_t>(dsts.size());
  }

  Plan run() {
    // Stock's dispatcher refuses a mutable list with a conjugate or negative view.
    const int64_t lazy = lazy_bit_dst(dsts_);
    if (lazy >= 0) return stock(Kind::ConjNeg, lazy, 0);
    int64_t whole_at = -1;
    int8_t whole_side = kSubDst;
    if (const Capability* whole = whole_list_capability(&whole_at, &whole_side)) {
      return whole_list(*whole, whole_at, whole_side);
    }
    dst_iv_.reserve(dsts_.size());
    src_iv_.reserve(dsts_.size());
    for (int64_t i = 0; i < plan_.n; ++i) {
      const auto& d = dsts_[i];
      const auto& s = srcs_[i];
      const PairClass c = classify_pair(d, s, caps_, rule_);
      if (c.route == Route::Stock) return stock(c.why.kind, i, c.why.sub);
      if (c.route == Route::Empty) {
        plan_.empty.push_back(i);
        continue;
      }
      // Addresses as they are now, as const_data_ptr() reads them: planning materializes no
      // copy-on-write destination (the copy will). Such a destination still shares memory with
      // its sibling, so the comparisons below see an overlap where the copy would not: stock's
      // loop then takes the call, which is never wrong.
      auto& pi = info_[i];
      pi.dptr = reinterpret_cast<int64_t>(d.const_data_ptr());
      pi.sptr = reinterpret_cast<int64_t>(s.const_data_ptr());
      pi.batched = c.batched;
      dst_iv_.push_back({device_rank(d.device()), pi.dptr, pi.dptr + span_bytes(d), i, true});
      if (s.numel() != 0) {
        src_iv_.push_back({device_rank(s.device()), pi.sptr, pi.sptr + span_bytes(s), i, false});
      }
      if (c.route == Route::Fallback) {
        plan_.fallback.push_back({i, c.why.kind, c.why.sub});
      } else if (c.contiguous) {
        const RunPair p{run_key(*d.unsafeGetTensorImpl(), *s.unsafeGetTensorImpl()), static_cast<uintptr_t>(pi.dptr),
                        static_cast<uintptr_t>(pi.sptr), tensor_bytes(d), tensor_bytes(s),
                        storage_of(d), storage_of(s)};
        const bool joins = cursor_.continues(p);
        if (!joins) close_run();
        cursor_.add(p, joins);
        run_.push_back(i);
      } else {
        close_run();
        singles_.push_back(i);
      }
    }
    close_run();
    if (first_overlap()) {
      return std::move(plan_);
    }
    coalesce_and_group();
    transfer_groups();
    if (nothing_fast_on_batching_device()) {
      const auto f = plan_.fallback.front();
      plan_.no_fast_pair = true;
      return stock(f.kind, f.index, f.sub);
    }
    plan_.fallback_launches = static_cast<int64_t>(plan_.fallback.size());
    return std::move(plan_);
  }

 private:
  // A whole-stock plan keeps the empty and fallback pairs found before the decision, which explain
  // lists beside the call's reason (the stats count pairs as planner/execute.cpp count_reasons).
  Plan stock(Kind kind, int64_t a, int8_t sub, int64_t b = -1) {
    plan_.stock = kind;
    plan_.stock_a = a;
    plan_.stock_b = b;
    plan_.stock_sub = sub;
    mark_own_op();
    return std::move(plan_);
  }

  // A whole-stock plan on a device whose own op batches lists (device_batching.h): that op takes the
  // call whole, as under stock.
  void mark_own_op() {
    if (own_op_capability(dsts_, srcs_, caps_) != nullptr) {
      plan_.own_op = true;
      plan_.stock_launches = device_batching(dsts_, srcs_, non_blocking_, caps_).launches;
    }
  }

  // Source-dtype groups the device's own op sends as one batched host <-> device memcpy
  // (device_batching.h) go to it as they are: the same launch and the same bytes as under stock.
  void transfer_groups() {
    const Capability* cap = own_op_capability(dsts_, srcs_, caps_);
    if (cap == nullptr || !cap->batched_transfers) return;
    const DeviceBatching r = device_batching(dsts_, srcs_, non_blocking_, caps_);
    std::vector<uint8_t> moved(dsts_.size(), 0);
    for (size_t g = 0; g < r.groups.size(); ++g) {
      if (r.of_group[g] != DeviceBatch::Transfer) continue;
      const auto begin = static_cast<int64_t>(plan_.group_members.size());
      plan_.group_members.insert(plan_.group_members.end(), r.groups[g].begin(), r.groups[g].end());
      plan_.groups.push_back({begin, static_cast<int64_t>(plan_.group_members.size()),
                              batch_launches(DeviceBatch::Transfer, static_cast<int64_t>(r.groups[g].size()), *cap), true});
      for (const int64_t i : r.groups[g]) moved[i] = 1;
    }
    auto gone = [&](int64_t i) { return moved[i] != 0; };
    plan_.fallback.erase(std::remove_if(plan_.fallback.begin(), plan_.fallback.end(),
                                        [&](const Fallback& f) { return gone(f.index); }),
                         plan_.fallback.end());
    plan_.empty.erase(std::remove_if(plan_.empty.begin(), plan_.empty.end(), gone), plan_.empty.end());
  }

  // The first whole_list_only device type among the tensors
  // (dsts, then srcs), where every tensor is a plain strided one; `at` gets its pair index and
  // `side` its side (kSubDst, kSubSrc).
  const Capability* whole_list_capability(int64_t* at, int8_t* side) {
    const Capability* found = nullptr;
    const int64_t n = plan_.n;
    for (int64_t k = 0; k < 2 * n; ++k) {
      const auto& t = k < n ? dsts_[k] : srcs_[k - n];
      const Kind k_why = tensor_refusal(*t.unsafeGetTensorImpl(), k < n, rule_).kind;
      if (k_why == Kind::Subclass || k_why == Kind::Layout || k_why == Kind::Meta) return nullptr;
      if (found == nullptr) {
        const Capability* cap = caps_.get(t.device().type());
        if (cap != nullptr && cap->whole_list) {
          found = cap;
          *at = k < n ? k : k - n;
          *side = k < n ? kSubDst : kSubSrc;
        }
      }
    }
    return found;
  }

  // ATen foreach_tensor_copy_list_kernel_cuda_'s batched kernel.
  bool stock_batches() const {
    const auto dev = dsts_[0].device();
    const auto sdt = srcs_[0].scalar_type();
    const auto ddt = dsts_[0].scalar_type();
    for (int64_t i = 0; i < plan_.n; ++i) {
      const auto& d = dsts_[i];
      const auto& s = srcs_[i];
      if (d.device() != dev || s.device() != dev || d.scalar_type() != ddt || s.scalar_type() != sdt) {
        return false;
      }
      if (!same_layout(*d.unsafeGetTensorImpl(), *s.unsafeGetTensorImpl())) return false;
    }
    return true;
  }

  // Stock takes the call whole, as one foreach group of every pair (empties included) where it
  // batches the list, which the device's own op gets as it is (the CPU kernel serves no
  // whole_list_only capability: cpu_kernel_serves), else as its per-pair copy_ loop.
  Plan whole_list(const Capability& cap, int64_t at, int8_t side) {
    if (!stock_batches()) return stock(Kind::WholeListOp, at, side);
    for (int64_t i = 0; i < plan_.n; ++i) plan_.group_members.push_back(i);
    plan_.groups.push_back({0, plan_.n, cap.launches(plan_.n), false});
    return std::move(plan_);
  }

  int64_t device_rank(c10::Device dev) {
    for (size_t k = 0; k < devices_.size(); ++k) {
      if (devices_[k] == dev) return static_cast<int64_t>(k);
    }
    devices_.push_back(dev);
    return static_cast<int64_t>(devices_.size() - 1);
  }

  // Whether any destination overlaps another tensor of the call on its device: the library's
  // overlap rule (planner/spans.h), device by device. Usually there is none, and the destinations
  // (and the sources) arrive in address order: then no sort is needed.
  bool any_overlap() {
    for (int64_t rank = 0; rank < static_cast<int64_t>(devices_.size()); ++rank) {
      std::vector<Span> dsts, srcs;
      for (const auto& iv : dst_iv_) {
        if (iv.rank == rank) dsts.push_back({static_cast<uintptr_t>(iv.start), static_cast<uintptr_t>(iv.end)});
      }
      for (const auto& iv : src_iv_) {
        if (iv.rank == rank) srcs.push_back({static_cast<uintptr_t>(iv.start), static_cast<uintptr_t>(iv.end)});
      }
      if (writes_overlap(dsts, srcs)) return true;
    }
    return false;
  }

  // Whether some destination overlaps (any_overlap(): the overlap rule decides); the call is then
  // stock's (aliasing), and the sweep below names the first overlapping pair by a fixed order of the
  // intervals.
  bool first_overlap() {
    if (!any_overlap()) return false;
    plan_.stock = Kind::Aliasing;
    mark_own_op();
    std::vector<Interval> intervals;
    intervals.reserve(dst_iv_.size() + src_iv_.size());
    intervals.insert(intervals.end(), dst_iv_.begin(), dst_iv_.end());
    intervals.insert(intervals.end(), src_iv_.begin(), src_iv_.end());
    if (devices_.size() > 1) {
      // Sorted by str(device); ranks so far are first-seen order.
      std::vector<std::pair<std::string, int64_t>> names;
      for (size_t k = 0; k < devices_.size(); ++k) names.emplace_back(devices_[k].str(), k);
      std::sort(names.begin(), names.end());
      std::vector<int64_t> order(devices_.size());
      for (size_t k = 0; k < names.size(); ++k) order[names[k].second] = static_cast<int64_t>(k);
      for (auto& iv : intervals) iv.rank = order[iv.rank];
    }
    std::sort(intervals.begin(), intervals.end(),
              [](const Interval& a, const Interval& b) { return a.key() < b.key(); });
    int64_t rank = -1, end_all = -1, end_dst = -1;
    const Interval* who_all = nullptr;
    const Interval* who_dst = nullptr;
    for (const auto& iv : intervals) {
      if (iv.rank != rank) {
        rank = iv.rank;
        end_all = end_dst = -1;
        who_all = who_dst = nullptr;
      }
      const Interval* hit = nullptr;
      if (iv.is_dst && iv.start < end_all) {
        hit = who_all;
      } else if (!iv.is_dst && iv.start < end_dst) {
        hit = who_dst;
      }
      if (hit != nullptr) {
        plan_.stock_a = hit->index;
        plan_.stock_b = iv.index;
        plan_.stock_sub = static_cast<int8_t>((hit->is_dst ? kSubEarlierDst : 0) | (iv.is_dst ? kSubLaterDst : 0));
        return true;
      }
      if (iv.end > end_all) {
        end_all = iv.end;
        who_all = &iv;
      }
      if (iv.is_dst && iv.end > end_dst) {
        end_dst = iv.end;
        who_dst = &iv;
      }
    }
    // Not reached: the sweep meets a pair wherever writes_overlap() does (the same intervals).
    return true;
  }

  uint32_t key_of(int64_t i) const { return run_key(*dsts_[i].unsafeGetTensorImpl(), *srcs_[i].unsafeGetTensorImpl()); }

  // Ends the open run (planner/runs.h): two or more pairs are a run, one is a single.
  void close_run() {
    if (run_.size() > 1) {
      runs_.push_back(run_);
      numels_.push_back(cursor_.dbytes / static_cast<int64_t>(dsts_[run_[0]].element_size()));
    } else if (run_.size() == 1) {
      singles_.push_back(run_[0]);
    }
    run_.clear();
    cursor_.len = 0;
  }

  // On a device whose kernel batches many pairs a launch, a run costs one launch where its pairs
  // might ride along in a launch their group makes anyway: per (device, dtypes) key, keep the
  // largest runs only while that issues fewer launches (ties keep the flat copy).
  void dissolve_runs() {
    std::vector<uint32_t> keys;
    for (const auto& r : runs_) {
      const uint32_t k = key_of(r[0]);
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
    std::vector<uint8_t> drop(runs_.size(), 0);
    for (const uint32_t k : keys) {
      const Capability* cap = caps_.get(key_device_type(k));
      std::vector<size_t> mine;
      for (size_t r = 0; r < runs_.size(); ++r) {
        if (key_of(runs_[r][0]) == k) mine.push_back(r);
      }
      if (cap == nullptr || keeps_every_run(*cap) || !info_[runs_[mine[0]][0]].batched) {
        continue;
      }
      std::stable_sort(mine.begin(), mine.end(),
                       [&](size_t a, size_t b) { return runs_[a].size() > runs_[b].size(); });
      int64_t pooled = 0;
      for (const int64_t i : singles_) pooled += key_of(i) == k ? 1 : 0;
      // cost(kept) = kept + launches(pooled + members of the runs not kept), kept = |mine| .. 0
      size_t best_kept = mine.size();
      int64_t best = static_cast<int64_t>(mine.size()) + (pooled ? cap->launches(pooled) : 0);
      int64_t extra = 0;
      for (size_t kept = mine.size(); kept-- > 0;) {
        extra += static_cast<int64_t>(runs_[mine[kept]].size());
        const int64_t cost = static_cast<int64_t>(kept) + cap->launches(pooled + extra);
        if (cost < best) {
          best = cost;
          best_kept = kept;
        }
      }
      for (size_t j = best_kept; j < mine.size(); ++j) drop[mine[j]] = 1;
    }
    size_t w = 0;
    for (size_t r = 0; r < runs_.size(); ++r) {
      if (drop[r]) {
        singles_.insert(singles_.end(), runs_[r].begin(), runs_[r].end());
      } else {
        if (w != r) {
          runs_[w] = std::move(runs_[r]);
          numels_[w] = numels_[r];
        }
        ++w;
      }
    }
    runs_.resize(w);
    numels_.resize(w);
  }

  // Stages a cross-dtype group the kernel cannot convert (planner/plan.h, Stage) when that issues fewer
  // launches than its pairs' one copy each. Needs contiguous tensors, the kernel's same-dtype op
  // for the sources (and for the destinations, where they are not one adjacent run), and a
  // scratch budget (stage_bytes); chunks keep each one's scratch within it.
  bool stage(const std::vector<int64_t>& idx, const Capability& cap) {
    const auto st = srcs_[idx[0]].scalar_type();
    const auto dt = dsts_[idx[0]].scalar_type();
    if (cap.max_per_launch == 0 || cap.stage_bytes <= 0 || !cap.supports(st, st)) return false;
    for (const int64_t i : idx) {
      if (!srcs_[i].is_contiguous() || !dsts_[i].is_contiguous()) return false;
    }
    // Where the destinations are one adjacent run in one storage, every chunk of them is too,
    // and the scratch holds the sources only; else it holds a destination-dtype copy as well.
    bool adjacent = true;
    int64_t span = 0;
    for (size_t k = 0; k < idx.size() && adjacent; ++k) {
      const int64_t i = idx[k];
      adjacent = info_[i].dptr == info_[idx[0]].dptr + span && storage_of(dsts_[i]) == storage_of(dsts_[idx[0]]);
      span += tensor_bytes(dsts_[i]);
    }
    if (!adjacent && !cap.supports(dt, dt)) return false;
    struct Chunk {
      size_t begin, end;
      int64_t numel;
    };
    std::vector<Chunk> chunks;
    int64_t bytes = 0;
    for (size_t k = 0; k < idx.size(); ++k) {
      const int64_t i = idx[k];
      const int64_t b = tensor_bytes(srcs_[i]) + (adjacent ? 0 : tensor_bytes(dsts_[i]));
      if (chunks.empty() || bytes + b > cap.stage_bytes) {
        chunks.push_back({k, k + 1, dsts_[i].numel()});
        bytes = b;
        continue;
      }
      chunks.back().end = k + 1;
      chunks.back().numel += dsts_[i].numel();
      bytes += b;
    }
    // A chunk is staged only where it issues fewer launches than its pairs copied one by one (a
    // tensor over the budget is a chunk of one: it stays a plain copy). Returns true: every pair
    // is staged or a fallback.
    for (const auto& c : chunks) {
      const int64_t n = static_cast<int64_t>(c.end - c.begin);
      const int64_t launches = cap.launches(n) + 1 + (adjacent ? 0 : cap.launches(n));
      int64_t bytes_c = 0;
      for (size_t k = c.begin; k < c.end; ++k) {
        bytes_c += tensor_bytes(srcs_[idx[k]]) + (adjacent ? 0 : tensor_bytes(dsts_[idx[k]]));
      }
      if (launches >= n || bytes_c > cap.stage_bytes) {
        for (size_t k = c.begin; k < c.end; ++k) plan_.fallback.push_back({idx[k], Kind::Dtype, kSubUnsupported});
        continue;
      }
      const auto begin = static_cast<int64_t>(plan_.stage_members.size());
      plan_.stage_members.insert(plan_.stage_members.end(), idx.begin() + c.begin, idx.begin() + c.end);
      plan_.stages.push_back({begin, static_cast<int64_t>(plan_.stage_members.size()), c.numel, adjacent, launches});
    }
    return true;
  }

  void coalesce_and_group() {
    if (!runs_.empty()) dissolve_runs();
    for (size_t r = 0; r < runs_.size(); ++r) {
      const auto begin = static_cast<int64_t>(plan_.run_members.size());
      plan_.run_members.insert(plan_.run_members.end(), runs_[r].begin(), runs_[r].end());
      plan_.runs.push_back({begin, static_cast<int64_t>(plan_.run_members.size()), numels_[r]});
    }

    std::sort(singles_.begin(), singles_.end());
    // Groups in the order of their first single (planner/runs.h).
    std::vector<uint32_t> keys;
    std::vector<std::vector<int64_t>> members;
    size_t last = 0;
    for (const int64_t i : singles_) {
      const size_t g = group_of(keys, key_of(i), last);
      if (g == members.size()) members.emplace_back();
      members[g].push_back(i);
    }
    for (size_t g = 0; g < members.size(); ++g) {
      const auto& idx = members[g];
      const auto& d0 = dsts_[idx[0]];
      const Capability* cap = caps_.get(d0.device().type());
      if (info_[idx[0]].batched) {
        const auto begin = static_cast<int64_t>(plan_.group_members.size());
        plan_.group_members.insert(plan_.group_members.end(), idx.begin(), idx.end());
        plan_.groups.push_back({begin, static_cast<int64_t>(plan_.group_members.size()),
                                cap->launches(static_cast<int64_t>(idx.size())), false});
        continue;
      }
      if (cap != nullptr && stage(idx, *cap)) continue;
      for (const int64_t i : idx) plan_.fallback.push_back({i, Kind::Dtype, kSubUnsupported});
    }
    std::sort(plan_.fallback.begin(), plan_.fallback.end(),
              [](const Fallback& a, const Fallback& b) { return a.index < b.index; });
  }

  // Nothing of the call takes a fast path, on a device whose own op batches lists
  // (device_batching.h: op-plugin's batched H2D / D2H memcpy, its aclnnForeachCopy): that op
  // takes the call whole, as stock, never in more launches than pair by pair.
  bool nothing_fast_on_batching_device() const {
    if (!plan_.runs.empty() || !plan_.groups.empty() || !plan_.stages.empty() || plan_.fallback.empty()) {
      return false;
    }
    return own_op_capability(dsts_, srcs_, caps_) != nullptr;
  }

  at::TensorList dsts_, srcs_;
  const CapabilityTable& caps_;
  const RuleContext rule_ = RuleContext::here();
  bool non_blocking_;
  std::vector<PairInfo> info_;
  std::vector<Interval> dst_iv_, src_iv_;
  std::vector<c10::Device> devices_;
  // The coalescing rule's state (planner/runs.h): the open run's members and cursor, the runs
  // closed so far with their element counts, and the singles.
  std::vector<int64_t> run_, singles_, numels_;
  std::vector<std::vector<int64_t>> runs_;
  RunCursor cursor_;
  Plan plan_;
};

}  // namespace

void check_lists(at::TensorList dsts, at::TensorList srcs) {
  // ATen check_foreach_api_restrictions: both lists non-empty, then equal lengths.
  TORCH_CHECK(!dsts.empty() && !srcs.empty(), "Tensor list must have at least one tensor.");
  TORCH_CHECK(dsts.size() == srcs.size(), "Tensor lists must have the same number of tensors, got ",
              dsts.size(), " and ", srcs.size());
}

std::vector<uint8_t> stock_keeps_version(at::TensorList dsts, at::TensorList srcs, bool non_blocking,
                                         const CapabilityTable& caps) {
  const DeviceBatching r = device_batching(dsts, srcs, non_blocking, caps);
  if (r.cap == nullptr) return {};
  std::vector<uint8_t> keep(dsts.size(), 0);
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = r.of_pair[i] != DeviceBatch::PerTensor;
  return keep;
}

int64_t Plan::launches() const {
  if (stock != Kind::None) return own_op ? stock_launches : n;
  int64_t l = static_cast<int64_t>(runs.size()) + fallback_launches;
  for (const Group& g : groups) l += g.launches;
  for (const Stage& s : stages) l += s.launches;
  return l;
}

Plan build_plan(at::TensorList dsts, at::TensorList srcs, const CapabilityTable& caps, bool non_blocking) {
  return Planner(dsts, srcs, caps, non_blocking).run();
}


}  // namespace npu_dispatch
