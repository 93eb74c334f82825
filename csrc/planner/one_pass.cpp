#include "planner/one_pass.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>

#include "planner/execute.h"
#include "planner/plan.h"
#include "cpu/storage_write.h"

namespace npu_dispatch {
namespace {

std::atomic<int64_t> g_one_pass_calls{0};

constexpr size_t kAheadTensors = 8, kAheadStorages = 4;

void prefetch_tensor(const c10::TensorImpl* t) {
  const char* p = reinterpret_cast<const char*>(t);
  for (size_t off = 0; off < sizeof(c10::TensorImpl); off += 64) __builtin_prefetch(p + off);
}

uint16_t dtype_pair(c10::ScalarType src, c10::ScalarType dst) {
  return static_cast<uint16_t>(static_cast<uint8_t>(src) | (static_cast<uint8_t>(dst) << 8));
}

}  // namespace

int64_t one_pass_calls() { return g_one_pass_calls.load(std::memory_order_relaxed); }

bool OnePass::prepare(at::TensorList dsts, at::TensorList srcs, const CapabilityTable& caps) {
  std::vector<c10::TensorImpl*> impls(2 * dsts.size());
  for (size_t i = 0; i < dsts.size(); ++i) {
    impls[i] = dsts[i].unsafeGetTensorImpl();
    impls[dsts.size() + i] = srcs[i].unsafeGetTensorImpl();
  }
  return prepare(impls.data(), impls.data() + dsts.size(), dsts.size(), caps, RuleContext::here());
}

void OnePass::reset(int64_t split_threads) {
  auto dst = std::move(dst_spans_);
  auto src = std::move(src_spans_);
  auto groups = std::move(groups_);
  auto batch = std::move(batch_);
  *this = OnePass();
  dst.clear();
  src.clear();
  groups.clear();
  batch.reset(split_threads);
  dst_spans_ = std::move(dst);
  src_spans_ = std::move(src);
  groups_ = std::move(groups);
  batch_ = std::move(batch);
}

bool OnePass::prepare(c10::TensorImpl* const* dsts, c10::TensorImpl* const* srcs, size_t n,
                       const CapabilityTable& caps, const RuleContext& rule) {
  cap_ = caps.get(c10::DeviceType::CPU);
  // A whole_list_only entry (a test making CPU follow CUDA's rules): the planner decides.
  if (cap_ == nullptr || cap_->whole_list) return false;
  dst_spans_.reserve(n);
  src_spans_.reserve(n);
  batch_.reserve(n);
  c10::ScalarType last_s = c10::ScalarType::Undefined, last_d = c10::ScalarType::Undefined;
  CopyOp op = CopyOp::Memcpy;
  bool mergeable = false;
  for (size_t i = 0; i < n; ++i) {
    stop_ = first_pair_ + i;
    // Metadata of a list copied again and again is out of the nearer caches by the next call
    // (the copy streamed its bytes through them): ask for the tensors some pairs ahead, and
    // for the storages of nearer ones, whose tensors have arrived by then.
    if (i + kAheadTensors < n) {
      prefetch_tensor(dsts[i + kAheadTensors]);
      prefetch_tensor(srcs[i + kAheadTensors]);
    }
    if (i + kAheadStorages < n) {
      __builtin_prefetch(dsts[i + kAheadStorages]->unsafe_storage().unsafeGetStorageImpl());
      __builtin_prefetch(srcs[i + kAheadStorages]->unsafe_storage().unsafeGetStorageImpl());
    }
    c10::TensorImpl* d = dsts[i];
    const c10::TensorImpl* s = srcs[i];
    // CPU pairs only, where the rule puts them on the fast route to the CPU pass, contiguous;
    // anything else is the planner's.
    if (d->device_type() != c10::DeviceType::CPU || s->device_type() != c10::DeviceType::CPU) return false;
    const PairClass c = classify_pair(*d, *s, caps, rule);
    if (c.route == Route::Empty) {
      ++empty_;
      continue;
    }
    if (c.route != Route::Fast || !c.batched || !c.contiguous) return false;
    const auto dt = d->dtype().toScalarType();
    const auto st = s->dtype().toScalarType();
    if (st != last_s || dt != last_d) {
      if (!batch_.dtype_op(st, dt, &op, &mergeable)) return false;
      last_s = st;
      last_d = dt;
    }
    const int64_t numel = d->numel();
    const c10::Storage& dst_storage = d->unsafe_storage();
    const c10::Storage& src_storage = s->unsafe_storage();
    if (!dst_storage || !src_storage) return false;
    // A copy-on-write (or otherwise lazily materialized) destination would be materialized by
    // mutable_data below even if a later pair sent the call elsewhere: leave it to the planner.
    if (lazily_materialized(*dst_storage.unsafeGetStorageImpl(), 0)) return false;
    const auto ditem = static_cast<int64_t>(d->itemsize());
    const auto sitem = static_cast<int64_t>(s->itemsize());
    // StorageImpl::mutable_data raises where a write is forbidden, as TensorImpl::mutable_data.
    auto* dptr = static_cast<char*>(dst_storage.mutable_data()) + d->storage_offset() * ditem;
    const auto* sptr = static_cast<const char*>(src_storage.data()) + s->storage_offset() * sitem;
    const int64_t dbytes = numel * ditem;
    const int64_t sbytes = numel * sitem;
    const auto du = reinterpret_cast<uintptr_t>(dptr);
    const auto su = reinterpret_cast<uintptr_t>(sptr);
    const uint16_t dtypes = dtype_pair(st, dt);
    const bool adjacent = run_len_ > 0 && dtypes == run_dtypes_ &&
                          du == dst_spans_.back().end && su == src_spans_.back().end;
    // A Memcpy item counts bytes (WorkItem::n).
    const int64_t item_n = op == CopyOp::Memcpy ? dbytes : numel;
    // planner/plan.cpp coalesces only inside one storage; two storages side by side are its call.
    if (adjacent && (dst_storage.unsafeGetStorageImpl() != run_.dst_storage ||
                     src_storage.unsafeGetStorageImpl() != run_.src_storage)) {
      return false;
    }
    if (mergeable) {
      batch_.add_contiguous(dptr, sptr, item_n, op, adjacent);
    } else {
      batch_.add_fbgemm_f16_to_f32(dptr, sptr, numel);
    }
    if (adjacent) {
      dst_spans_.back().end += dbytes;
      src_spans_.back().end += sbytes;
      ++run_len_;
      run_bytes_ += dbytes;
    } else {
      if (runs_opened_ == 1) head_ = current_run();  // the first run ends here
      close_run();
      dst_spans_.push_back({du, du + dbytes});
      src_spans_.push_back({su, su + sbytes});
      run_len_ = 1;
      run_bytes_ = dbytes;
      run_dtypes_ = dtypes;
      ++runs_opened_;
      run_.dst = du;
      run_.src = su;
      run_.dst_storage = dst_storage.unsafeGetStorageImpl();
      run_.src_storage = src_storage.unsafeGetStorageImpl();
      run_.first_pair = first_pair_ + i;
      run_.dtypes = dtypes;
      // Where the first run starts is known now (the threaded checks' boundary test needs it even
      // if a later pair stops this share); its length once it ends.
      if (runs_opened_ == 1) head_ = run_;
    }
    bytes_ += dbytes;
  }
  stop_ = SIZE_MAX;
  if (runs_opened_ > 0) {
    tail_ = current_run();
    if (runs_opened_ == 1) head_ = tail_;
  }
  close_run();
  return disjoint();
}

void OnePass::close_run_slow() {
  if (run_len_ >= 2) {
    ++runs_;
    run_tensors_ += run_len_;
    coalesced_bytes_ += run_bytes_;
  } else if (run_len_ == 1) {
    // A single joins its dtype pair's group (planner/plan.cpp groups singles by device and dtypes).
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

// The library's overlap rule (planner/spans.h). The destination list stays sorted, and the hulls
// are kept: the threaded checks compare shares with them.
bool OnePass::disjoint() { return !writes_overlap(dst_spans_, src_spans_, &dst_hull_, &src_hull_); }

void count_one_pass_call() { g_one_pass_calls.fetch_add(1, std::memory_order_relaxed); }

CallResult one_pass_counts(int64_t runs, int64_t run_tensors, int64_t coalesced_bytes,
                           const std::vector<OnePass::Group>& groups, int64_t empty, const Capability& cap) {
  CallResult v;
  v.executed = true;
  if (runs > 0) v.path(kCoalesced).add(run_tensors, coalesced_bytes, runs);
  for (const auto& g : groups) v.path(kForeach).add(g.tensors, g.bytes, cap.launches(g.tensors));
  v.path(kEmpty).tensors = empty;
  return v;
}

KernelRanges::KernelRanges(bool coalesced, bool foreach) {
  if (coalesced && coalesced_.isActive()) coalesced_.before("npu_dispatch::coalesced");
  if (foreach && foreach_.isActive()) foreach_.before("npu_dispatch::foreach");
  if (kernel_.isActive()) kernel_.before("npu_dispatch::cpu_kernel");
}

CallResult OnePass::run(int64_t serial_moved_bytes) {
  {
    // One kernel pass serves both of the executor's paths.
    KernelRanges ranges(runs_ > 0, !groups_.empty());
    batch_.run(serial_moved_bytes);
  }
  count_one_pass_call();
  return one_pass_counts(runs_, run_tensors_, coalesced_bytes_, groups_, empty_, *cap_);
}

}  // namespace npu_dispatch
