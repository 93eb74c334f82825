#include "planner/one_pass.h"

#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <atomic>

#include "planner/execute.h"
#include "planner/plan.h"
#include "cpu/storage_write.h"

namespace npu_dispatch {
namespace {

std::atomic<int64_t> g_one_pass_calls{0};

void prefetch_tensor(const c10::TensorImpl* t) {
  const char* p = reinterpret_cast<const char*>(t);
  for (size_t off = 0; off < sizeof(c10::TensorImpl); off += 64) __builtin_prefetch(p + off);
}

}  // namespace

int64_t one_pass_calls() { return g_one_pass_calls.load(std::memory_order_relaxed); }

bool OnePass::prepare(c10::TensorImpl* const* dsts, c10::TensorImpl* const* srcs, size_t n,
                       const CapabilityTable& caps, const RuleContext& rule) {
  cap_ = caps.get(c10::DeviceType::CPU);
  // Only where the CPU kernel serves the CPU, a host pass that keeps every run (planner/runs.h
  // keeps_every_run); another entry (a test giving CPU CUDA's or a batching device's rules): the
  // planner decides.
  if (!cpu_kernel_serves(c10::DeviceType::CPU, cap_)) return false;
  dst_spans_.reserve(n);
  src_spans_.reserve(n);
  batch_.reserve(n);
  c10::ScalarType last_s = c10::ScalarType::Undefined, last_d = c10::ScalarType::Undefined;
  CopyOp op = CopyOp::Memcpy;
  bool mergeable = false;
  for (size_t i = 0; i < n; ++i) {
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
    // Both on the CPU, whose index is always the default one.
    const RunPair p{run_key(c10::Device(c10::DeviceType::CPU), st, dt), du, su, dbytes, sbytes,
                    dst_storage.unsafeGetStorageImpl(), src_storage.unsafeGetStorageImpl()};
    const bool joins = cursor_.continues(p);
    // A Memcpy item counts bytes (WorkItem::n).
    const int64_t item_n = op == CopyOp::Memcpy ? dbytes : numel;
    if (mergeable) {
      batch_.add_contiguous(dptr, sptr, item_n, op, joins);
    } else {
      batch_.add_fbgemm_f16_to_f32(dptr, sptr, numel);
    }
    if (joins) {
      dst_spans_.back().end += dbytes;
      src_spans_.back().end += sbytes;
    } else {
      close_run();
      dst_spans_.push_back({du, du + dbytes});
      src_spans_.push_back({su, su + sbytes});
    }
    cursor_.add(p, joins);
    bytes_ += dbytes;
  }
  close_run();
  // The library's overlap rule (planner/spans.h).
  return !writes_overlap(dst_spans_, src_spans_);
}

CallResult OnePass::run(int64_t serial_moved_bytes) {
  {
    at::RecordFunction coalesced(at::RecordScope::FUNCTION), foreach(at::RecordScope::FUNCTION),
        kernel(at::RecordScope::FUNCTION);
    if (runs_ > 0 && coalesced.isActive()) coalesced.before("npu_dispatch::coalesced");
    if (!groups_.empty() && foreach.isActive()) foreach.before("npu_dispatch::foreach");
    if (kernel.isActive()) kernel.before("npu_dispatch::cpu_kernel");
    batch_.run(serial_moved_bytes);
  }
  g_one_pass_calls.fetch_add(1, std::memory_order_relaxed);
  CallResult v;
  v.executed = true;
  if (runs_ > 0) v.path(kCoalesced).add(run_tensors_, coalesced_bytes_, runs_);
  for (const auto& g : groups_) v.path(kForeach).add(g.tensors, g.bytes, cap_->launches(g.tensors));
  v.path(kEmpty).tensors = empty_;
  return v;
}

OnePassCall::OnePassCall(size_t n) : n_(n) {
  // The TensorImpl list, kept per calling thread from call to call (lists up to kKeptPairs
  // pairs, while no other OnePassCall of this thread holds it: none is known to, warnings
  // reach Python only after the call returns).
  static thread_local std::vector<c10::TensorImpl*> kept;
  static thread_local bool taken = false;
  if (n <= kKeptPairs && !taken) {
    taken = true;
    taken_ = &taken;
    impls_ = &kept;
  } else {
    impls_ = &own_impls_;
  }
  impls_->resize(2 * n);
}

OnePassCall::~OnePassCall() {
  if (taken_ != nullptr) *taken_ = false;
}

OnePassCall::Step OnePassCall::prepare(const CapabilityTable& caps, bool grad_check, int64_t max_held_bytes, bool bump,
                                       int64_t serial_moved_bytes) {
  bump_ = bump;
  serial_moved_bytes_ = serial_moved_bytes;
  c10::TensorImpl* const* d = impls_->data();
  if (!one_pass_.prepare(d, d + n_, n_, caps, RuleContext::here(grad_check))) return Step::Refused;
  if (one_pass_.bytes() > max_held_bytes) return Step::Prepared;
  copy();
  return Step::Copied;
}

void OnePassCall::copy() {
  counts_ = one_pass_.run(serial_moved_bytes_);
  if (!bump_) return;
  // Each listed destination's bump, as stock's in-place op moves it (planner/classify.h
  // stock_bumps_pair: inside inference mode, not a pair of two inference tensors).
  c10::TensorImpl* const* d = impls_->data();
  const bool in_inference = c10::InferenceMode::is_enabled();
  for (size_t i = 0; i < n_; ++i) {
    if (stock_bumps_pair(*d[i], *d[n_ + i], in_inference)) d[i]->bump_version();
  }
}

}  // namespace npu_dispatch
