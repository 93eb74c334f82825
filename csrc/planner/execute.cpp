#include "planner/execute.h"

#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/copy.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/strides.h>

#include <cmath>
#include <cstring>

#include "planner/borrowed.h"
#include "planner/capability_table.h"
#include "planner/spans.h"
#include "cpu/copy_kernel.h"

namespace npu_dispatch {
namespace {

// The reasons a call that leaves the fast path counts, by its plan: a whole-stock call every pair
// under its reason, except one with no fast pair (each pair under its own, the empty ones under
// the device's own op, which takes them); else each fallback pair under its own.
void count_reasons(const Plan& p, CallResult* v) {
  if (p.stock != Kind::None && !p.no_fast_pair) {
    v->reason(p.stock) += p.n;
    return;
  }
  for (const auto& f : p.fallback) v->reason(f.kind) += 1;
  if (p.no_fast_pair) v->reason(Kind::DeviceOp) += p.n - static_cast<int64_t>(p.fallback.size());
}

// A device's fused _foreach_copy_ (CUDA's multi_tensor_apply kernel) bumps its destinations' version
// counters itself, even below ADInplaceOrView; its per-pair loop does not. A listed destination
// with a counter tells which kernel ran: it moved or it did not.
const at::Tensor* probe(at::TensorList dsts) {
  for (const auto& d : dsts) {
    if (has_version_counter(d)) return &d;
  }
  return nullptr;
}

int64_t version(const at::Tensor* t) { return t == nullptr ? 0 : t->_version(); }

// Stock's CPU copy of a 0-dim float32 into a 0-dim bfloat16 picks its conversion loop from stale
// stack memory (docs/stock_quirks.md): a NaN comes out 0xffff or 0x7fc0, depending on what ran
// on this thread before. The loop below writes the defined one, c10::BFloat16(float)'s 0x7fc0
// (what stock gives on a clean stack), whatever ran before. True where the pair is such a copy
// of a NaN; read before the copy, since the source may share the destination's bytes.
bool zero_dim_nan_to_bf16(const at::Tensor& d, const at::Tensor& s) {
  if (d.dim() != 0 || s.dim() != 0 || d.scalar_type() != at::kBFloat16 || s.scalar_type() != at::kFloat ||
      !d.is_cpu() || !s.is_cpu() || !s.has_storage() || s.numel() != 1) {
    return false;
  }
  float v;
  std::memcpy(&v, s.const_data_ptr(), sizeof v);
  return std::isnan(v);
}

void write_defined_bf16_nan(const at::Tensor& d) {
  const uint16_t word = 0x7FC0;  // c10::BFloat16 round_to_nearest_even's NaN
  std::memcpy(d.mutable_data_ptr(), &word, sizeof word);
}

// Profiler ranges npu_dispatch::<path>; RECORD_FUNCTION is free with no profiler.
class Executor {
 public:
  Executor(const Plan& p, at::TensorList dsts, at::TensorList srcs, bool non_blocking, CallResult& v,
           std::vector<uint8_t>* self_bumped, const std::vector<uint8_t>& kept, const CapabilityTable& caps,
           int64_t serial_moved_bytes)
      : p_(p), dsts_(dsts), srcs_(srcs), non_blocking_(non_blocking), v_(v), self_bumped_(self_bumped), kept_(kept),
        caps_(caps), serial_moved_bytes_(serial_moved_bytes) {}

  // Aliasing, a pair that may raise, a 0-dim conversion, meta tensors, a whole_list_only device's
  // list stock does not batch: stock's per-pair loop, a sequential copy_ loop,
  // bumping each destination as it goes, so an error leaves the same pairs written and bumped as
  // stock does. Subclasses, wrapper tensors, other layouts: the stock op itself.
  void stock(bool bump) {
    RECORD_FUNCTION("npu_dispatch::stock", std::vector<c10::IValue>());
    if (p_.own_op) {
      // The device's own op, whole (device_batching.h): its grouping, order, errors and launches. Its
      // per-tensor copies moves counters through copy_ where the caller's stock call would (with
      // `bump`, ADInplaceOrView is back in reach); its batched kernels move none.
      if (bump) {
        const auto tls = c10::impl::tls_local_dispatch_key_set();
        c10::impl::ForceDispatchKeyGuard reach(tls.included_, tls.excluded_.remove(c10::DispatchKey::ADInplaceOrView));
        at::_foreach_copy_(dsts_, srcs_, non_blocking_);
      } else {
        at::_foreach_copy_(dsts_, srcs_, non_blocking_);
      }
    } else if (p_.stock == Kind::Aliasing || p_.stock == Kind::MayRaise || p_.stock == Kind::Meta ||
        p_.stock == Kind::OrderDependent || p_.stock == Kind::WholeListOp) {
      const bool in_inference = c10::InferenceMode::is_enabled();
      for (size_t i = 0; i < dsts_.size(); ++i) {
        auto d = dsts_[i];
        const bool defined_nan = zero_dim_nan_to_bf16(d, srcs_[i]);
        d.copy_(srcs_[i], non_blocking_);
        if (defined_nan) write_defined_bf16_nan(d);
        // Stock's bump, after the write (for a destination without a counter outside inference
        // mode it raises stock's error); below ADInplaceOrView stock bumps nothing.
        if (bump && !kept(i) && stock_bumps_pair(d, srcs_[i], in_inference)) d.unsafeGetTensorImpl()->bump_version();
      }
    } else {
      const at::Tensor* t = probe(dsts_);
      const int64_t before = version(t);
      at::_foreach_copy_(dsts_, srcs_, non_blocking_);
      if (bump && version(t) == before) bump_pairs_as_stock(dsts_, srcs_, c10::InferenceMode::is_enabled(), kept_);
    }
    v_.path(kStock).add(p_.n, total_bytes(dsts_), p_.launches());
    count_reasons(p_, &v_);
  }

  void runs() {
    RECORD_FUNCTION("npu_dispatch::coalesced", std::vector<c10::IValue>());
    for (const auto& r : p_.runs) {
      const int64_t* members = p_.run_members.data() + r.begin;
      const int64_t count = r.end - r.begin;
      const auto& d0 = dsts_[members[0]];
      if (!kernel_serves(d0)) {
        // One flat copy over the run: the same elementwise conversion stock applies per pair.
        const auto& s0 = srcs_[members[0]];
        auto flat_d = d0.as_strided({r.numel}, {1}, d0.storage_offset());
        flat_d.copy_(s0.as_strided({r.numel}, {1}, s0.storage_offset()), non_blocking_);
      } else if (!batch_.add_run(dsts_, srcs_, members, count, r.numel)) {
        // Not one of the kernel's conversions: stock pair by pair keeps its exact bits, where a
        // flat copy_ might not (FBGEMM's fp16 tails depend on where each copy ends).
        stock_pairs(members, count);
      }
      v_.path(kCoalesced).add(count, r.numel * static_cast<int64_t>(d0.element_size()), 1);
    }
  }

  void groups() {
    RECORD_FUNCTION("npu_dispatch::foreach", std::vector<c10::IValue>());
    for (const auto& g : p_.groups) {
      const int64_t* members = p_.group_members.data() + g.begin;
      const int64_t count = g.end - g.begin;
      int64_t bytes = 0;
      for (int64_t k = 0; k < count; ++k) bytes += tensor_bytes(dsts_[members[k]]);
      v_.path(kForeach).add(count, bytes, g.launches);
      if (!kernel_serves(dsts_[members[0]]) || g.transfer) {
        // The device's own batched kernel (CUDA multi_tensor_apply, op-plugin aclnnForeachCopy).
        stock_pairs(members, count);
        continue;
      }
      sub_d_.clear();
      sub_s_.clear();
      for (int64_t k = 0; k < count; ++k) {
        if (!batch_.add_pair(dsts_[members[k]], srcs_[members[k]])) {
          sub_d_.push_back(dsts_[members[k]]);
          sub_s_.push_back(srcs_[members[k]]);
        }
      }
      if (!sub_d_.empty()) at::_foreach_copy_(sub_d_, sub_s_, non_blocking_);
    }
  }

  // Staged casts (planner/plan.h, Stage): the device's batched same-dtype copy into scratch, then a flat
  // cast; the cast is elementwise, so each element gets the conversion stock's copy_ gives it.
  void stages() {
    RECORD_FUNCTION("npu_dispatch::staged", std::vector<c10::IValue>());
    for (const auto& st : p_.stages) {
      const int64_t* members = p_.stage_members.data() + st.begin;
      const int64_t count = st.end - st.begin;
      const auto& d0 = dsts_[members[0]];
      const auto scratch = at::empty({st.numel}, srcs_[members[0]].options());
      std::vector<at::Tensor> views, picked;
      views.reserve(count);
      picked.reserve(count);
      int64_t off = 0, bytes = 0;
      for (int64_t k = 0; k < count; ++k) {
        const auto& s = srcs_[members[k]];
        views.push_back(scratch.as_strided(s.sizes(), c10::contiguous_strides(s.sizes()), off));
        picked.push_back(s);
        off += s.numel();
        bytes += tensor_bytes(dsts_[members[k]]);
      }
      at::_foreach_copy_(views, picked, non_blocking_);
      if (st.adjacent) {
        auto flat = d0.as_strided({st.numel}, {1}, d0.storage_offset());
        flat.copy_(scratch, non_blocking_);
      } else {
        auto cast = at::empty({st.numel}, d0.options());
        cast.copy_(scratch, non_blocking_);
        views.clear();
        picked.clear();
        off = 0;
        for (int64_t k = 0; k < count; ++k) {
          const auto& d = dsts_[members[k]];
          views.push_back(cast.as_strided(d.sizes(), c10::contiguous_strides(d.sizes()), off));
          picked.push_back(d);
          off += d.numel();
        }
        at::_foreach_copy_(picked, views, non_blocking_);
      }
      v_.path(kStaged).add(count, bytes, st.launches);
    }
  }

  // The CPU runs and groups of the call, in one pass.
  void cpu_kernel() {
    if (batch_.empty()) return;
    RECORD_FUNCTION("npu_dispatch::cpu_kernel", std::vector<c10::IValue>());
    batch_.run(serial_moved_bytes_);
  }

  // Pair by pair, as stock's per-tensor path: a sub-list handed to the device's _foreach_copy_
  // could take a kernel the full list would not (op-plugin's batched H2D memcpy of a now
  // uniform list copies raw bytes and ignores strides).
  void fallback() {
    RECORD_FUNCTION("npu_dispatch::fallback", std::vector<c10::IValue>());
    int64_t bytes = 0;
    for (const auto& f : p_.fallback) {
      auto d = dsts_[f.index];
      d.copy_(srcs_[f.index], non_blocking_);
      bytes += tensor_bytes(d);
    }
    count_reasons(p_, &v_);
    v_.path(kFallback).add(static_cast<int64_t>(p_.fallback.size()), bytes, p_.fallback_launches);
  }

 private:
  bool kept(size_t i) const { return !kept_.empty() && kept_[i]; }
  bool kernel_serves(const at::Tensor& d) const {
    const auto type = d.device().type();
    return cpu_kernel_serves(type, caps_.get(type));
  }

  // Sub-lists borrow: the caller's lists hold the references for the whole call.
  void stock_pairs(const int64_t* members, int64_t count) {
    sub_d_.clear();
    sub_s_.clear();
    for (int64_t k = 0; k < count; ++k) {
      sub_d_.push_back(dsts_[members[k]]);
      sub_s_.push_back(srcs_[members[k]]);
    }
    const at::Tensor* t = probe(sub_d_);
    const int64_t before = version(t);
    at::_foreach_copy_(sub_d_, sub_s_, non_blocking_);
    if (version(t) != before) {
      for (int64_t k = 0; k < count; ++k) (*self_bumped_)[members[k]] = 1;
    }
  }

  const Plan& p_;
  at::TensorList dsts_, srcs_;
  bool non_blocking_;
  CallResult& v_;
  std::vector<uint8_t>* self_bumped_;
  const std::vector<uint8_t>& kept_;  // stock_keeps_version: counters stock's own op leaves unmoved
  const CapabilityTable& caps_;
  int64_t serial_moved_bytes_;
  CpuCopyBatch batch_;
  BorrowedTensors sub_d_, sub_s_;
};

}  // namespace

CallResult execute(const Plan& p, at::TensorList dsts, at::TensorList srcs, bool non_blocking, bool strict, bool bump,
                   const CapabilityTable& caps, std::vector<uint8_t>* self_bumped, int64_t serial_moved_bytes) {
  CallResult v;
  if (strict && p.leaves_fast_path()) {
    v.blocked = true;
    count_reasons(p, &v);  // what the call would have counted, for the strict error
    return v;
  }
  v.executed = true;
  self_bumped->assign(dsts.size(), 0);
  const std::vector<uint8_t> kept = bump ? stock_keeps_version(dsts, srcs, non_blocking, caps)
                                         : std::vector<uint8_t>();
  // The caller bumps none of the pairs stock leaves alone.
  for (size_t i = 0; i < kept.size(); ++i) (*self_bumped)[i] |= kept[i];
  Executor ex(p, dsts, srcs, non_blocking, v, self_bumped, kept, caps, serial_moved_bytes);
  if (p.stock != Kind::None) {
    ex.stock(bump);
    v.bumped = true;
    return v;
  }
  if (!p.runs.empty()) ex.runs();
  if (!p.groups.empty()) ex.groups();
  if (!p.stages.empty()) ex.stages();
  ex.cpu_kernel();
  if (!p.fallback.empty()) ex.fallback();
  if (!p.empty.empty()) v.path(kEmpty).add(static_cast<int64_t>(p.empty.size()), 0, 0);
  return v;
}

CallResult stock_counts(Kind why, int64_t pairs, int64_t bytes, bool bumped) {
  pairs = std::max<int64_t>(pairs, 1);
  CallResult v;
  v.executed = true;
  v.bumped = bumped;
  v.path(kStock).add(pairs, bytes, pairs);
  v.reason(why) = pairs;
  return v;
}

CallResult blocked_counts(Kind why, int64_t pairs) {
  pairs = std::max<int64_t>(pairs, 1);
  CallResult v;
  v.blocked = true;
  v.reason(why) = pairs;
  return v;
}

}  // namespace npu_dispatch
