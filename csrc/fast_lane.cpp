#include "fast_lane.h"

#include <ATen/record_function.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/COW.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "execute.h"
#include "plan.h"

namespace npu_dispatch {
namespace {

std::atomic<int64_t> g_lane_calls{0}, g_split_calls{0};

// The key set every ordinary CPU tensor outside inference mode carries (c10::TensorImpl's
// constructor: backend, autograd and autocast keys). Anything more or less (Python key, conj or
// neg bit, nested, sparse, mkldnn, quantized, meta, functional or batched wrapper, inference
// tensor) makes the set differ, and the planner decides.
c10::DispatchKeySet plain_cpu_keys() {
  static const c10::DispatchKeySet ks =
      c10::DispatchKeySet(c10::DispatchKey::CPU) |
      c10::getAutogradRelatedKeySetFromBackend(c10::BackendComponent::CPUBit) |
      c10::getAutocastRelatedKeySetFromBackend(c10::BackendComponent::CPUBit);
  return ks;
}

// Copy-on-write storages: a cow DataPtr in every torch our range covers, and where StorageImpl
// has materializers (newer torch), any storage with one.
template <typename S>
auto lazily_materialized(const S& st, int) -> decltype(st.has_materializer()) {
  return st.has_materializer() || c10::impl::cow::is_cow_data_ptr(st.data_ptr());
}
template <typename S>
bool lazily_materialized(const S& st, long) {
  return c10::impl::cow::is_cow_data_ptr(st.data_ptr());
}

uint16_t dtype_pair(c10::ScalarType src, c10::ScalarType dst) {
  return static_cast<uint16_t>(static_cast<uint8_t>(src) | (static_cast<uint8_t>(dst) << 8));
}

// A second thread pays for itself once reading a side's metadata costs more than waking it
// (20 to 40 ns a tensor against about a microsecond, on the 2-core CI machine).
constexpr int64_t kDefaultSplitPairs = 128;
std::atomic<int64_t> g_split_pairs{kDefaultSplitPairs};

// One tensor's facts; false where the lane refuses it. Raises what the StorageImpl's data access
// raises (the only call here that can).
template <bool kDst>
C10_ALWAYS_INLINE bool read_tensor(c10::TensorImpl* t, c10::DispatchKeySet plain, bool grad_check, FastLane::Facts* f) {
  if (t->key_set() != plain) return false;
  // Only a tensor with autograd metadata can require grad (an out-of-line call).
  if (grad_check && t->autograd_meta() != nullptr && t->requires_grad()) return false;
  f->dtype = t->dtype().toScalarType();
  const auto sizes = t->sizes();
  f->dim = static_cast<uint32_t>(sizes.size());
  f->sizes = sizes.data();
  for (uint32_t k = 0; k < std::min(f->dim, FastLane::Facts::kInlineDims); ++k) f->inline_sizes[k] = sizes[k];
  f->numel = t->numel();
  f->itemsize = static_cast<uint8_t>(t->itemsize());
  f->data = nullptr;
  f->storage = nullptr;
  if (f->numel == 0) return true;
  if (!t->is_contiguous()) return false;
  const c10::Storage& storage = t->unsafe_storage();
  if (!storage) return false;
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  f->storage = impl;
  const int64_t offset = t->storage_offset() * f->itemsize;
  if constexpr (kDst) {
    // A copy-on-write (or otherwise lazily materialized) destination would be materialized by
    // mutable_data below even if a later pair sent the call elsewhere: leave it to the planner.
    if (lazily_materialized(*impl, 0)) return false;
    // StorageImpl::mutable_data raises where a write is forbidden, as TensorImpl::mutable_data.
    f->data = static_cast<const char*>(impl->mutable_data()) + offset;
  } else {
    f->data = static_cast<const char*>(impl->data()) + offset;
  }
  return true;
}

// read_tensor's answer with any error caught, so that the walk over pairs decides what it means.
template <bool kDst>
C10_ALWAYS_INLINE FastLane::Read read_one(c10::TensorImpl* t, c10::DispatchKeySet plain, bool grad_check, FastLane::Facts* f,
                        std::exception_ptr* error) {
  try {
    return read_tensor<kDst>(t, plain, grad_check, f) ? FastLane::Read::Ok : FastLane::Read::Refused;
  } catch (...) {
    *error = std::current_exception();
    return FastLane::Read::Raised;
  }
}

template <bool kDst>
void read_side(c10::TensorImpl* const* ts, size_t n, bool grad_check, FastLane::SidePass* p) {
  const auto plain = plain_cpu_keys();
  FastLane::Facts* facts = p->facts.get();
  size_t i = 0;
  while (i < n && read_one<kDst>(ts[i], plain, grad_check, &facts[i], &p->error) == FastLane::Read::Ok) ++i;
  p->stop = i;
}

bool same_sizes(const FastLane::Facts& a, const FastLane::Facts& b) {
  if (a.dim != b.dim) return false;
  for (uint32_t k = 0; k < a.dim; ++k) {
    const bool inl = k < FastLane::Facts::kInlineDims;
    if ((inl ? a.inline_sizes[k] : a.sizes[k]) != (inl ? b.inline_sizes[k] : b.sizes[k])) return false;
  }
  return true;
}

}  // namespace

int64_t fast_lane_calls() { return g_lane_calls.load(std::memory_order_relaxed); }
int64_t fast_lane_split_calls() { return g_split_calls.load(std::memory_order_relaxed); }
int64_t fast_lane_split_pairs(int64_t min_pairs) {
  return min_pairs < 0 ? g_split_pairs.load() : g_split_pairs.exchange(min_pairs);
}

bool FastLane::prepare(at::TensorList dsts, at::TensorList srcs, const CapabilityTable& caps) {
  std::vector<c10::TensorImpl*> impls(2 * dsts.size());
  for (size_t i = 0; i < dsts.size(); ++i) {
    impls[i] = dsts[i].unsafeGetTensorImpl();
    impls[dsts.size() + i] = srcs[i].unsafeGetTensorImpl();
  }
  return prepare(impls.data(), impls.data() + dsts.size(), dsts.size(), caps, false, false);
}

// Serially, one pass: each pair's two tensors are read, then the pair is added. Split across two
// threads (long lists), two passes: each side's tensors are read on their own (the sources on a
// second thread, the destinations on the caller's, where their data access may warn through the
// caller's warning handler), then the pairs are added in order up to the first tensor a side
// stopped at. Either way add_pair sees what one serial walk would, in the same order.
bool FastLane::prepare(c10::TensorImpl* const* dsts, c10::TensorImpl* const* srcs, size_t n,
                       const CapabilityTable& caps, bool grad_check, bool may_split) {
  cap_ = caps.get(c10::DeviceType::CPU);
  // A whole_list_only entry (a test making CPU follow CUDA's rules): the planner decides.
  if (cap_ == nullptr || cap_->whole_list) return false;
  dst_spans_.reserve(n);
  src_spans_.reserve(n);
  batch_.reserve(n);
  if (!may_split || static_cast<int64_t>(n) < g_split_pairs.load(std::memory_order_relaxed) ||
      at::get_num_threads() < 2 || at::in_parallel_region()) {
    const auto plain = plain_cpu_keys();
    Facts df, sf;
    std::exception_ptr de, se;  // set only where the walk stops
    for (size_t i = 0; i < n; ++i) {
      const Read dr = read_one<true>(dsts[i], plain, grad_check, &df, &de);
      const Read sr = dr == Read::Refused ? Read::Refused : read_one<false>(srcs[i], plain, grad_check, &sf, &se);
      if (!add_pair(df, dr, de, sf, sr, se)) return false;
    }
    close_run();
    return disjoint();
  }
  SidePass d, s;
  d.facts.reset(new Facts[n]);
  s.facts.reset(new Facts[n]);
  bool dst_read = false;
  const auto caller = std::this_thread::get_id();
  at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      if (k == 1) {
        read_side<false>(srcs, n, grad_check, &s);
      } else if (std::this_thread::get_id() == caller) {
        read_side<true>(dsts, n, grad_check, &d);
        dst_read = true;
      }
    }
  });
  g_split_calls.fetch_add(1, std::memory_order_relaxed);
  if (!dst_read) read_side<true>(dsts, n, grad_check, &d);
  auto status = [](const SidePass& p, size_t i) {
    return i < p.stop ? Read::Ok : p.error ? Read::Raised : Read::Refused;
  };
  // At the first stop add_pair refuses or raises.
  const size_t stop = std::min(d.stop, s.stop);
  for (size_t i = 0; i < n && i <= stop; ++i) {
    if (!add_pair(d.facts[i], status(d, i), d.error, s.facts[i], status(s, i), s.error)) return false;
  }
  close_run();
  return disjoint();
}

C10_ALWAYS_INLINE bool FastLane::add_pair(const Facts& df, Read dr, const std::exception_ptr& de, const Facts& sf, Read sr,
                        const std::exception_ptr& se) {
  if (dr == Read::Refused || sr == Read::Refused) return false;
  if (sf.dtype != last_s_ || df.dtype != last_d_) {
    if (!copy_dtype(sf.dtype) || !copy_dtype(df.dtype)) return false;
    if (!batch_.route(sf.dtype, df.dtype, &op_, &mergeable_) || !cap_->supports(sf.dtype, df.dtype)) {
      return false;
    }
    last_s_ = sf.dtype;
    last_d_ = df.dtype;
  }
  // Broadcasting sources and other shapes: the planner (and stock's messages).
  if (!same_sizes(df, sf)) return false;
  const int64_t numel = df.numel;
  if (numel == 0) {
    ++empty_;
    return dr == Read::Ok && sr == Read::Ok;  // (only a non-empty tensor's data access raises)
  }
  // A 0-dim conversion: the planner sends the whole call to stock's loop (order_dependent).
  if (op_ != CopyOp::Memcpy && df.dim == 0) return false;
  if (dr == Read::Raised) std::rethrow_exception(de);
  if (sr == Read::Raised) std::rethrow_exception(se);
  char* dptr = const_cast<char*>(df.data);
  const char* sptr = sf.data;
  const int64_t dbytes = numel * df.itemsize;
  const int64_t sbytes = numel * sf.itemsize;
  const auto du = reinterpret_cast<uintptr_t>(dptr);
  const auto su = reinterpret_cast<uintptr_t>(sptr);
  const uint16_t dtypes = dtype_pair(sf.dtype, df.dtype);
  const bool adjacent = run_len_ > 0 && dtypes == run_dtypes_ &&
                        du == dst_spans_.back().end && su == src_spans_.back().end;
  if (adjacent) {
    // plan.cpp coalesces only inside one storage; two storages side by side are its call.
    if (df.storage != run_dst_storage_ || sf.storage != run_src_storage_) return false;
    batch_.add_contiguous(dptr, sptr, numel, df.itemsize, op_, mergeable_);
    dst_spans_.back().end += dbytes;
    src_spans_.back().end += sbytes;
    ++run_len_;
    run_bytes_ += dbytes;
  } else {
    close_run();
    batch_.add_contiguous(dptr, sptr, numel, df.itemsize, op_, false);
    dst_spans_.push_back({du, du + dbytes});
    src_spans_.push_back({su, su + sbytes});
    run_len_ = 1;
    run_bytes_ = dbytes;
    run_dtypes_ = dtypes;
    run_dst_storage_ = df.storage;
    run_src_storage_ = sf.storage;
  }
  bytes_ += dbytes;
  return true;
}

void FastLane::close_run() {
  if (run_len_ >= 2) {
    ++runs_;
    run_tensors_ += run_len_;
    coalesced_bytes_ += run_bytes_;
  } else if (run_len_ == 1) {
    // A single joins its dtype pair's group (plan.cpp groups singles by device and dtypes).
    // Lists usually hold one dtype pair: try the last group hit first.
    const uint16_t dtypes = run_dtypes_;
    if (last_group_ >= groups_.size() || groups_[last_group_].dtypes != dtypes) {
      last_group_ = std::find_if(groups_.begin(), groups_.end(),
                                 [&](const Group& x) { return x.dtypes == dtypes; }) - groups_.begin();
      if (last_group_ == groups_.size()) groups_.push_back({dtypes, 0, 0});
    }
    groups_[last_group_].tensors += 1;
    groups_[last_group_].bytes += run_bytes_;
  }
  run_len_ = 0;
}

// No destination span meets another destination span or any source span (plan.cpp's aliasing
// test; sources may share memory with each other). Spans usually arrive in address order, so
// the sorts are mostly skipped; then one merge walk compares sources with destinations.
bool FastLane::disjoint() {
  if (dst_spans_.empty()) return true;
  auto by_start = [](const Span& a, const Span& b) { return a.start < b.start; };
  if (!std::is_sorted(dst_spans_.begin(), dst_spans_.end(), by_start)) {
    std::sort(dst_spans_.begin(), dst_spans_.end(), by_start);
  }
  for (size_t k = 1; k < dst_spans_.size(); ++k) {
    if (dst_spans_[k].start < dst_spans_[k - 1].end) return false;
  }
  // Only sources inside the destinations' hull can meet one (separate allocations made before
  // or after the destinations' usually lie outside it).
  const uintptr_t lo = dst_spans_.front().start;
  const uintptr_t hi = dst_spans_.back().end;
  auto& inside = src_spans_;
  inside.erase(std::remove_if(inside.begin(), inside.end(),
                              [&](const Span& s) { return s.end <= lo || s.start >= hi; }),
               inside.end());
  if (!std::is_sorted(inside.begin(), inside.end(), by_start)) {
    std::sort(inside.begin(), inside.end(), by_start);
  }
  size_t k = 0;
  for (const auto& s : inside) {
    while (k < dst_spans_.size() && dst_spans_[k].end <= s.start) ++k;
    if (k == dst_spans_.size()) break;
    if (dst_spans_[k].start < s.end) return false;
  }
  return true;
}

std::vector<int64_t> FastLane::run() {
  std::vector<int64_t> v(kCountsLen, 0);
  v[0] = kExecuted;
  {
    // The executor's profiler ranges (execute.cpp); here one kernel pass serves both paths.
    at::RecordFunction coalesced(at::RecordScope::FUNCTION);
    if (runs_ > 0 && coalesced.isActive()) coalesced.before("npu_dispatch::coalesced");
    at::RecordFunction foreach_range(at::RecordScope::FUNCTION);
    if (!groups_.empty() && foreach_range.isActive()) foreach_range.before("npu_dispatch::foreach");
    RECORD_FUNCTION("npu_dispatch::cpu_kernel", std::vector<c10::IValue>());
    batch_.run();
  }
  g_lane_calls.fetch_add(1, std::memory_order_relaxed);
  if (runs_ > 0) {
    v[path_slot(kCoalesced, 0)] = run_tensors_;
    v[path_slot(kCoalesced, 1)] = coalesced_bytes_;
    v[path_slot(kCoalesced, 2)] = runs_;
  }
  for (const auto& g : groups_) {
    v[path_slot(kForeach, 0)] += g.tensors;
    v[path_slot(kForeach, 1)] += g.bytes;
    v[path_slot(kForeach, 2)] += cap_->launches(g.tensors);
  }
  v[path_slot(kEmpty, 0)] = empty_;
  return v;
}

}  // namespace npu_dispatch
