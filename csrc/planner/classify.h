// The library's one eligibility rule: whether a copy pair may leave stock's op, which kernel takes
// it, or why it stays stock's. The planner (plan.cpp) and the one-pass plan (one_pass.cpp) ask it
// for every pair; the FSDP copies (fsdp/copies.cpp) ask its tensor half for every tensor, then check
// what their own ops require (shapes, one dtype, contiguous layouts). Its hot half is inline
// (planner/classify_impl.h): the one-pass plan asks it for every pair. The list-level rules are planner/spans.h (overlap between pairs) and planner/runs.h
// (coalescing and grouping).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "planner/capability_table.h"

namespace npu_dispatch {

// Why pairs (or a whole call) leave the fast path: every reason the library reports, its Python
// paths' included. Python sees them by name only (kKindNames, exported by binding/to_python.cpp).
enum class Kind : int8_t {
  None = -1,
  Subclass = 0,
  NoStorage,     // a strided tensor without storage (lazy, XLA): no address to plan with
  RequiresGrad,  // a tensor that requires grad under grad mode where the call skipped autograd: stock raises there
  Layout,
  Meta,
  MayRaise,
  Aliasing,
  Broadcast,
  Device,
  NotDense,
  NotContiguous,  // an FSDP copy's tensor that is not contiguous: its kernel reads row-major spans
  Strides,
  ConjNeg,
  Dtype,
  NoCapability,
  OrderDependent,  // whole call: a 0-dim conversion; stock's CPU copy reads its strides from stale stack (docs/stock_quirks.md)
  WholeListOp,  // whole call: a whole_list_only device (CUDA) that stock copies pair by pair
  Schema,  // whole call: an intercepted op whose installed schema this library was not written for
  DeviceOp,  // an FSDP copy the device's own op makes in one call; a list with no fast pair: its empty pairs
  // Whole calls the Python paths hand to stock (npu_dispatch/mode.py, engine.py): no native library,
  // an infrastructure mode below (proxy, fake, functionalization), another dispatch mode on the stack.
  NoNative,
  InfraMode,
  DispatchMode,
  Count,
};
constexpr int kNumKinds = static_cast<int>(Kind::Count);
// Kind's names, as stats, explain() and errors show them.
inline constexpr const char* kKindNames[] = {
    "subclass", "no_storage", "requires_grad", "layout", "meta", "may_raise", "aliasing", "broadcast", "device", "not_dense",
    "not_contiguous", "strides", "conj_neg", "dtype", "no_capability", "order_dependent", "whole_list_op", "schema",
    "device_op", "no_native", "infra_mode", "dispatch_mode",
};
static_assert(sizeof(kKindNames) / sizeof(kKindNames[0]) == kNumKinds, "a name per Kind");

// `sub` of a reason: which tensor or which variant, for the reason text only
// (npu_dispatch/_native_plan.py names them).
enum Sub : int8_t {
  kSubDst = 0, kSubSrc = 1,              // the side (subclass, layout, no_storage, not_dense, whole_list_op)
  kSubNoBroadcast = 0,                   // may_raise: shapes that do not broadcast
  kSubInternalOverlap = 1,               // may_raise: a destination that overlaps itself
  kSubOddDtype = 2,                      // may_raise: a dtype copy_ may raise on
  kSubInference = 3,                     // may_raise: an inference destination outside inference mode
  kSubEmptyWrite = 4,                    // may_raise: an empty destination whose pointer is refused
  kSubComplexToReal = 0, kSubUnsupported = 1,  // dtype
  kSubEarlierDst = 1, kSubLaterDst = 2,  // aliasing, bits: which of the two tensors is a destination
};

// The word for `sub` of a reason `k`, as explain() shows it (npu_dispatch/_native_plan.py).
inline std::string sub_name(Kind k, int8_t sub) {
  static constexpr const char* kSide[] = {"dst", "src"};
  static constexpr const char* kMayRaise[] = {"no_broadcast", "internal_overlap", "odd_dtype", "inference",
                                              "empty_write"};
  static_assert(kSubEmptyWrite + 1 == sizeof(kMayRaise) / sizeof(kMayRaise[0]), "a word per may_raise sub");
  switch (k) {
    case Kind::Subclass:
    case Kind::NoStorage:
    case Kind::Layout:
    case Kind::NotDense:
    case Kind::WholeListOp:
      return kSide[sub == kSubDst ? 0 : 1];
    case Kind::MayRaise:
      return sub >= 0 && sub <= kSubEmptyWrite ? kMayRaise[sub] : "";
    case Kind::Aliasing:  // "<later>_over_<earlier>"
      return std::string(kSide[(sub & kSubLaterDst) ? 0 : 1]) + "_over_" + kSide[(sub & kSubEarlierDst) ? 0 : 1];
    case Kind::Dtype:
      return sub == kSubComplexToReal ? "complex_to_real" : "unsupported";
    default:
      return "";
  }
}

// The thread state the rule reads, taken once on the calling thread (workers of a parallel region
// do not carry InferenceMode or GradMode).
struct RuleContext {
  bool grad_check = false;    // grad mode is on and the caller bypassed autograd
  bool in_inference = false;  // c10::InferenceMode is enabled
  static RuleContext here(bool grad_check = false) { return {grad_check, c10::InferenceMode::is_enabled()}; }
};

struct Refusal {
  Kind kind = Kind::None;
  int8_t sub = 0;
  explicit operator bool() const { return kind != Kind::None; }
};

// The tensor half of the rule, for one tensor a call reads (`written` false) or writes: a
// tensor the fast path may address directly, or the first reason it may not, in this order:
// subclass (a __torch_dispatch__ of its own, a wrapper, nested, undefined), layout (not strided),
// meta, no_storage, may_raise (a dtype copy_ may raise on; a written tensor without a version
// counter outside inference mode), then, with `rule.grad_check`, requires_grad. `sub` names the
// side (meta: always kSubDst).
inline Refusal tensor_refusal(const c10::TensorImpl& t, bool written, const RuleContext& rule);

// The tensor rule for an entry with no per-pair fallback (the FSDP copies): tensor_refusal, then
// conj_neg for a lazy conjugate or negative bit, which the pair rule leaves to a fallback pair.
Refusal fast_route_tensor(const c10::TensorImpl& t, bool written, const RuleContext& rule);
inline Refusal fast_route_tensor(const at::Tensor& t, bool written, const RuleContext& rule) {
  return fast_route_tensor(*t.unsafeGetTensorImpl(), written, rule);
}

// The kernels a pair may take.
enum class Route : int8_t {
  Stock,     // the whole call goes to stock's op (`why`)
  Fallback,  // this pair is stock's copy_ (`why`); the others may still be fast
  Empty,     // nothing to copy
  Fast,      // the fast route: the device's batched kernel where `batched`, else a staged cast or a fallback
};

struct PairClass {
  Route route = Route::Fast;
  Refusal why;
  bool contiguous = false;  // both tensors contiguous (may join an adjacent run; the one-pass plan's)
  bool batched = false;     // Fast: the device's kernel copies this dtype pair as it is
};

// The whole rule for one pair of `_foreach_copy_` (dst written, src read), given the capability
// table in force. Planner order: the tensor rule (dst before src at each step), shapes (broadcast
// or may_raise), a 0-dim CPU conversion (order_dependent), empty, a self-overlapping destination,
// then the fast route: same device, both dense with equal strides, no lazy conjugate or negative
// bit, no complex -> real, a capability for the device.
inline PairClass classify_pair(const c10::TensorImpl& d, const c10::TensorImpl& s, const CapabilityTable& caps,
                               const RuleContext& rule);
inline PairClass classify_pair(const at::Tensor& d, const at::Tensor& s, const CapabilityTable& caps,
                               const RuleContext& rule) {
  return classify_pair(*d.unsafeGetTensorImpl(), *s.unsafeGetTensorImpl(), caps, rule);
}

// Whether the tensor has a version counter: false for an inference tensor and for one made in
// inference mode and given a normal tensor's `.data` (plain keys); true for a normal tensor given
// an inference tensor's `.data` (is_inference() true).
inline bool has_version_counter(const c10::TensorImpl& t) { return t.version_counter().enabled(); }
inline bool has_version_counter(const at::Tensor& t) { return has_version_counter(*t.unsafeGetTensorImpl()); }

// Inference-keyed: no ADInplaceOrView key (an inference tensor, or a normal one given an inference
// tensor's `.data`).
inline bool inference_keyed(const c10::TensorImpl& t) { return !t.key_set().has(c10::DispatchKey::ADInplaceOrView); }

// The bump rule: whether stock's call bumps the tensors it writes (when bumps apply at all). Its
// ADInplaceOrView kernel runs unless, inside inference mode, every tensor of the call is
// inference-keyed (`all_inference_keyed`), and where it runs it calls bump_version() on each, which
// moves a tensor's counter, moves nothing for a tensor without one inside inference mode, and
// raises stock's error for such a tensor outside it.
inline bool stock_bumps(bool all_inference_keyed, bool in_inference) { return !in_inference || !all_inference_keyed; }
// The same for one pair of stock's per-pair copy_ loop.
inline bool stock_bumps_pair(const c10::TensorImpl& d, const c10::TensorImpl& s, bool in_inference) {
  return stock_bumps(inference_keyed(d) && inference_keyed(s), in_inference);
}
inline bool stock_bumps_pair(const at::Tensor& d, const at::Tensor& s, bool in_inference) {
  return stock_bumps_pair(*d.unsafeGetTensorImpl(), *s.unsafeGetTensorImpl(), in_inference);
}
// Moves each destination's counter as stock's _foreach_copy_ does (stock_bumps_pair), except
// the pairs `skip` marks (empty: none).
void bump_pairs_as_stock(at::TensorList dsts, at::TensorList srcs, bool in_inference,
                         const std::vector<uint8_t>& skip = {});
// The same for an out= op's call: moves each of `written`'s counters as stock's does, `read` the
// call's other tensors.
void bump_as_stock(at::TensorList written, at::TensorList read, bool in_inference);

// Index of the first destination with a lazy conjugate or negative bit (stock's dispatcher
// refuses such a mutable list before its kernel checks it), or -1.
int64_t lazy_bit_dst(at::TensorList dsts);

// copy_ between these never raises; others (quantized, bits, float8...) may raise midway, so the
// whole call stays on stock.
inline bool copy_dtype(c10::ScalarType t);

// Dense: contiguous in some dim order (dims of size 1 aside), as TensorImpl keeps it.
inline bool dense(const c10::TensorImpl& t) { return t.is_non_overlapping_and_dense(); }

// ATen's fast route, its layout half (aten/src/ATen/native/ForeachUtils.h can_use_fast_route):
// equal sizes, both dense, equal strides (dims of size 1 aside).
bool same_layout(const c10::TensorImpl& d, const c10::TensorImpl& s);

}  // namespace npu_dispatch

#include "planner/classify_impl.h"
