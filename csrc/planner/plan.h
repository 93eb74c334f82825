// The copy planner: the library's eligibility rule, pair by pair, with a named reason for every pair
// or call it leaves to stock. The one-pass plan (one_pass.h) and the FSDP copies (fsdp/copies.cpp)
// check narrower subsets of it (plain_tensor() below, planner/spans.h for overlap) and hand
// everything else here or to stock; npu_dispatch's Python side only renders plans
// (npu_dispatch/_native_plan.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "planner/capability_table.h"

namespace npu_dispatch {

// Why pairs (or a whole call) leave the fast path. Python sees them by name only (kKindNames,
// exported by binding/to_python.cpp).
enum class Kind : int8_t {
  None = -1,
  NotTensor = 0,
  Subclass,
  NoStorage,     // a strided tensor without storage (lazy, XLA): no address to plan with
  RequiresGrad,  // an out= argument that requires grad under grad mode: stock raises (its autograd kernel)
  Layout,
  Meta,
  MayRaise,
  Aliasing,
  Broadcast,
  Device,
  NotDense,
  Strides,
  ConjNeg,
  Dtype,
  NoCapability,
  OrderDependent,  // whole call: a 0-dim conversion; stock's CPU copy reads its strides from stale stack (docs/stock_quirks.md)
  WholeListOp,  // whole call: a whole_list_only device (CUDA) that stock copies pair by pair
  Schema,  // whole call: an intercepted op whose installed schema this library was not written for
  Count,
};
constexpr int kNumKinds = static_cast<int>(Kind::Count);
// Kind's names, as stats, explain() and errors show them.
inline constexpr const char* kKindNames[] = {
    "not_tensor", "subclass", "no_storage", "requires_grad", "layout", "meta", "may_raise", "aliasing", "broadcast", "device", "not_dense",
    "strides", "conj_neg", "dtype", "no_capability", "order_dependent", "whole_list_op", "schema",
};
static_assert(sizeof(kKindNames) / sizeof(kKindNames[0]) == kNumKinds, "a name per Kind");

struct Run {
  int64_t begin, end;  // into Plan::run_members
  int64_t numel;
};

struct Group {
  int64_t begin, end;  // into Plan::group_members
  int64_t launches;
  // A source-dtype group the device's own op sends as one batched host <-> device memcpy
  // (device_batching.h): handed to that op as it is.
  bool transfer;
};

// A stage: a cross-dtype group the device's batched kernel cannot convert, copied in fewer launches
// through scratch memory: one same-dtype batched copy of the sources into a contiguous scratch of the
// source dtype, then one flat cast into the destinations where they are one adjacent run, else a
// cast into a destination-dtype scratch and a batched copy out of it. One entry per chunk.
struct Stage {
  int64_t begin, end;  // into Plan::stage_members, in list order
  int64_t numel;  // elements of the chunk: the scratch size
  bool adjacent;  // the destinations are one adjacent run
  int64_t launches;
};

struct Fallback {
  int64_t index;
  Kind kind;
  int8_t sub;  // which side / which variant, only for the reason text
};

struct Plan {
  int64_t n = 0;
  Kind stock = Kind::None;  // whole call to the stock op when set
  int64_t stock_a = -1, stock_b = -1;
  int8_t stock_sub = 0;
  std::vector<int64_t> run_members, group_members, stage_members, empty;
  std::vector<Run> runs;
  std::vector<Group> groups;
  std::vector<Stage> stages;
  std::vector<Fallback> fallback;  // sorted by index
  int64_t fallback_launches = 0;
  // A whole_list_only device's list: its group goes to stock's op as it is.
  bool whole_list = false;
  // A whole-stock plan on a device whose own op batches lists (device_batching.h): that op takes the
  // call whole, issuing stock_launches launches.
  bool own_op = false;
  int64_t stock_launches = -1;
};


// Plans without touching data. Lists must be non-empty and of equal length (check first).
Plan build_plan(at::TensorList dsts, at::TensorList srcs, const CapabilityTable& caps, bool non_blocking = false);

void check_lists(at::TensorList dsts, at::TensorList srcs);

// A tensor with a __torch_dispatch__ of its own (DTensor, FakeTensor...) or a wrapper tensor
// (functional, batched, zero, nested), or an undefined one: never addressed directly.
bool is_subclass(const at::Tensor& t);

// For a defined tensor, `is_subclass(t) || t.is_conj() || t.is_neg()` as one test of its keys:
// whether they meet these (a long list's checks make it once a tensor, with no call).
c10::DispatchKeySet subclass_or_lazy_keys();

// Pairs whose version counter stock's own op leaves unmoved: on a device whose batched kernels
// keep versions (Capability::batched_keeps_versions), the pairs of each source-dtype group that
// kernel takes, as op-plugin groups and sends a list. Empty when no pair is on such a device.
std::vector<uint8_t> stock_keeps_version(at::TensorList dsts, at::TensorList srcs, bool non_blocking,
                                         const CapabilityTable& caps);

// Whether the tensor has a version counter: false for an inference
// tensor and for one made in inference mode and given a normal tensor's `.data` (plain keys); true
// for a normal tensor given an inference tensor's `.data` (is_inference() true).
inline bool has_version_counter(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->version_counter().enabled();
}

// Index of the first destination with a lazy conjugate or negative bit
// (stock's dispatcher refuses such a mutable list before its kernel checks it), or -1.
int64_t lazy_bit_dst(at::TensorList dsts);

// copy_ between these never raises; others (quantized, bits, float8...)
// may raise midway, so the whole call stays on stock.
bool copy_dtype(c10::ScalarType t);

// The tensor-level half of the planner's rule, for the entries that check one tensor at a time
// (the FSDP copies, fsdp/copies.cpp): a tensor the fast path may address directly, with no
// whole-call reason to leave it to stock: no subclass or wrapper, strided, not meta, with an
// address, a copy dtype, a version counter, no lazy conjugate or negative bit. The planner's
// per-pair classification (plan.cpp) refuses each of these for its own named reason; the
// one-pass plan (one_pass.h) accepts a narrower set still (plain CPU key sets).
bool plain_tensor(const at::Tensor& t);

}  // namespace npu_dispatch
