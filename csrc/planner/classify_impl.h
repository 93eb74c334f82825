// The eligibility rule's hot half (planner/classify.h), inline: the one-pass plan asks it for every
// pair of a call. Included by planner/classify.h only.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <c10/core/UndefinedTensorImpl.h>
#include <c10/macros/Macros.h>

#include "cpu/storage_write.h"

namespace npu_dispatch {
namespace classify_detail {

// Tensors with a __torch_dispatch__ of their own (the Python key: DTensor, FakeTensor...) and
// wrapper tensors (functional, batched, zero, nested): no raw memory to write, or copy_ would
// change their metadata too. A Parameter or a __torch_function__-only subclass is a plain tensor.
inline c10::DispatchKeySet subclass_keys() {
  static const c10::DispatchKeySet ks({
      c10::DispatchKey::Python,
      c10::DispatchKey::PythonTLSSnapshot,
      c10::DispatchKey::Functionalize,
      c10::DispatchKey::FuncTorchBatched,
      c10::DispatchKey::FuncTorchGradWrapper,
      c10::DispatchKey::BatchedNestedTensor,
      c10::DispatchKey::ZeroTensor,
      c10::DispatchKey::NestedTensor,
  });
  return ks;
}

// The key set of every ordinary CPU tensor outside inference mode (c10::TensorImpl's constructor:
// backend, autograd and autocast keys): no subclass or wrapper, strided, not meta, with storage,
// no lazy bit. The rule's steps those keys answer are skipped for such a tensor.
inline c10::DispatchKeySet plain_cpu_keys() {
  static const c10::DispatchKeySet ks =
      c10::DispatchKeySet(c10::DispatchKey::CPU) |
      c10::getAutogradRelatedKeySetFromBackend(c10::BackendComponent::CPUBit) |
      c10::getAutocastRelatedKeySetFromBackend(c10::BackendComponent::CPUBit);
  return ks;
}

inline bool is_undefined(const c10::TensorImpl& t) { return &t == c10::UndefinedTensorImpl::singleton(); }

// Storage-less strided tensors (lazy, XLA) have no address to compare. has_storage() is a
// virtual call, so skip it where every strided tensor has one.
inline bool addressable(const c10::TensorImpl& t) {
  switch (t.device_type()) {
    case c10::DeviceType::CPU:
    case c10::DeviceType::CUDA:
    case c10::DeviceType::PrivateUse1:
      return true;
    default:
      return t.has_storage();
  }
}

inline bool same_strides(const c10::TensorImpl& d, const c10::TensorImpl& s) {
  const auto sizes = d.sizes();
  const auto ds = d.strides();
  const auto ss = s.strides();
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] != 1 && ds[k] != ss[k]) return false;
  }
  return true;
}

// torch.broadcast_shapes(src, dst) == dst
inline bool broadcasts_to(c10::IntArrayRef src, c10::IntArrayRef dst) {
  if (src.size() > dst.size()) return false;
  const size_t off = dst.size() - src.size();
  for (size_t k = 0; k < src.size(); ++k) {
    if (src[k] != dst[off + k] && src[k] != 1) return false;
  }
  return true;
}

// The position of a tensor refusal in the rule's order, so that a pair reports the reason stock's
// loop meets first: dst before src within a step.
inline int step_of(const Refusal& r) {
  switch (r.kind) {
    case Kind::Subclass: return 0;
    case Kind::Layout: return 1;
    case Kind::Meta: return 2;
    case Kind::NoStorage: return 3;
    case Kind::MayRaise: return r.sub == kSubOddDtype ? 4 : 5;
    default: return 6;  // requires_grad
  }
}

inline PairClass stock(Kind kind, int8_t sub) {
  PairClass c;
  c.route = Route::Stock;
  c.why = {kind, sub};
  return c;
}

}  // namespace classify_detail

inline bool copy_dtype(c10::ScalarType t) {
  switch (t) {
    case at::kBool: case at::kByte: case at::kChar: case at::kShort: case at::kInt:
    case at::kLong: case at::kHalf: case at::kBFloat16: case at::kFloat: case at::kDouble:
    case at::kComplexFloat: case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

// tensor_refusal, where `plain` says the tensor carries an ordinary CPU tensor's keys (which answer
// its subclass, layout, meta and storage steps).
C10_ALWAYS_INLINE Refusal tensor_refusal_keyed(const c10::TensorImpl& t, bool written, const RuleContext& rule, bool plain) {
  const int8_t side = written ? kSubDst : kSubSrc;
  if (!plain) {
    if (classify_detail::is_undefined(t)) return {Kind::Subclass, side};
    if (t.key_set().has_any(classify_detail::subclass_keys())) return {Kind::Subclass, side};
    if (t.layout() != at::kStrided) return {Kind::Layout, side};
    if (t.is_meta()) return {Kind::Meta, kSubDst};
    if (!classify_detail::addressable(t)) return {Kind::NoStorage, side};
  }
  if (!copy_dtype(t.dtype().toScalarType())) return {Kind::MayRaise, kSubOddDtype};
  // Stock's version bump raises for a written tensor without a counter outside inference mode,
  // after its write.
  if (written && !has_version_counter(t) && !rule.in_inference) return {Kind::MayRaise, kSubInference};
  // Only a tensor with autograd metadata can require grad (no virtual call for the others).
  if (rule.grad_check && t.autograd_meta() != nullptr && t.requires_grad()) {
    return {Kind::RequiresGrad, side};
  }
  return {};
}

inline Refusal tensor_refusal(const c10::TensorImpl& t, bool written, const RuleContext& rule) {
  return tensor_refusal_keyed(t, written, rule, t.key_set() == classify_detail::plain_cpu_keys());
}

C10_ALWAYS_INLINE PairClass classify_pair(const c10::TensorImpl& d, const c10::TensorImpl& s, const CapabilityTable& caps,
                        const RuleContext& rule) {
  const c10::DispatchKeySet plain_keys = classify_detail::plain_cpu_keys();
  // Both ordinary CPU tensors: the keys answer the tensor rule's first steps and the lazy bits.
  const bool plain = d.key_set() == plain_keys && s.key_set() == plain_keys;
  {
    const Refusal rd = tensor_refusal_keyed(d, true, rule, plain || d.key_set() == plain_keys);
    const Refusal rs = tensor_refusal_keyed(s, false, rule, plain || s.key_set() == plain_keys);
    if (rd || rs) {
      const Refusal& first = !rs || (rd && classify_detail::step_of(rd) <= classify_detail::step_of(rs)) ? rd : rs;
      return classify_detail::stock(first.kind, first.sub);
    }
  }
  PairClass c;
  Refusal off;
  if (d.sizes() != s.sizes()) {
    if (!classify_detail::broadcasts_to(s.sizes(), d.sizes())) return classify_detail::stock(Kind::MayRaise, kSubNoBroadcast);
    off = {Kind::Broadcast, 0};
  }
  if (d.dim() == 0 && d.dtype() != s.dtype() && d.device_type() == c10::DeviceType::CPU) {
    return classify_detail::stock(Kind::OrderDependent, 0);
  }
  if (d.numel() == 0) {
    // Stock's copy_ asks for even an empty destination's mutable pointer; its loop takes a call
    // where that raises or materializes.
    if (!d.has_storage() || mutable_data_refused(d.storage())) return classify_detail::stock(Kind::MayRaise, kSubEmptyWrite);
    c.route = Route::Empty;
    return c;
  }
  const bool dcontig = d.is_contiguous(), scontig = s.is_contiguous();
  const bool ddense = dcontig || dense(d);
  if (!ddense && at::has_internal_overlap(const_cast<c10::TensorImpl*>(&d)) == at::MemOverlap::Yes) {
    return classify_detail::stock(Kind::MayRaise, kSubInternalOverlap);
  }
  c.contiguous = dcontig && scontig;
  const Capability* cap = caps.get(d.device_type());
  if (off) {
  } else if (d.device() != s.device()) {
    off = {Kind::Device, 0};
  } else if (!ddense) {
    off = {Kind::NotDense, kSubDst};
  } else if (!(scontig || dense(s))) {
    off = {Kind::NotDense, kSubSrc};
  } else if (!c.contiguous && !classify_detail::same_strides(d, s)) {
    off = {Kind::Strides, 0};
  } else if (!plain && (d.is_conj() || s.is_conj() || d.is_neg() || s.is_neg())) {
    off = {Kind::ConjNeg, 0};
  } else if (at::isComplexType(s.dtype().toScalarType()) && !at::isComplexType(d.dtype().toScalarType())) {
    off = {Kind::Dtype, kSubComplexToReal};
  } else if (cap == nullptr) {
    off = {Kind::NoCapability, 0};
  }
  if (off) {
    c.route = Route::Fallback;
    c.why = off;
    return c;
  }
  c.batched = cap->supports(s.dtype().toScalarType(), d.dtype().toScalarType());
  return c;
}

}  // namespace npu_dispatch
