// FSDP2's all-gather copy-out and reduce-scatter copy-in (fsdp/copies.h): the checks stock's ops
// make, then the copy-out as contiguous 1-D pieces (one CPU kernel pass, fsdp/copy_out_kernel.h, or the
// one planner as a _foreach_copy_ of piece views on a device) and chunk_cat as one pass of fsdp/chunk_cat_kernel.h;
// anything else is stock's op whole.
#include "fsdp/copies.h"

#include "planner/spans.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_chunk_cat.h>
#include <ATen/ops/split_with_sizes_copy.h>

#include <algorithm>

#include "planner/capability_table.h"
#include "fsdp/chunk_cat_kernel.h"
#include "planner/copy_call.h"
#include "fsdp/copy_out_kernel.h"
#include "cpu/byte_pass.h"
#include "cpu/copy_kernel.h"
#include "planner/execute.h"
#include "planner/plan.h"
#include "planner/tuning.h"

namespace npu_dispatch {

namespace {

// Which fast path the FSDP copies have on `device`, by its capability: the CPU kernel's pass where
// the capability is a host pass (Kind::None); none without a capability (no_capability) or on a
// whole_list_only device, which has kernels of its own (whole_list_op, CUDA); else the device's
// batched kernel (device_op), which the copy-out reaches through the planner and chunk_cat does
// not (the device's own op is one call, fewer launches than its pieces).
Kind fsdp_route(const c10::Device& device) {
  const auto caps = current_capabilities();
  const Capability* cap = caps->get(device.type());
  if (cap == nullptr) return Kind::NoCapability;
  if (cap->whole_list) return Kind::WholeListOp;
  return cpu_kernel_serves(device.type(), cap) ? Kind::None : Kind::DeviceOp;
}

// A device's copy-out: the rows as one _foreach_copy_ of 1-D views through the planner (its
// groups, stages and the device's batched kernel); row o of out[i] takes src's elements from
// (o * total + its offset) * inner. Under `strict`, a plan with any pair off the fast path writes
// nothing (nullopt).
std::optional<CallResult> device_rows(const at::Tensor& src, c10::IntArrayRef sizes, at::TensorList out,
                                      int64_t outer, int64_t total, int64_t inner, int64_t pairs,
                                                bool strict, Kind* why) {
  at::AutoDispatchBelowADInplaceOrView below;  // internal views move no counter
  std::vector<at::Tensor> d, s;
  d.reserve(pairs);
  s.reserve(pairs);
  for (int64_t o = 0; o < outer; ++o) {
    int64_t off = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const int64_t n = sizes[i] * inner;
      if (n > 0) {
        d.push_back(out[i].as_strided({n}, {1}, out[i].storage_offset() + o * n));
        s.push_back(src.as_strided({n}, {1}, src.storage_offset() + (o * total + off) * inner));
      }
      off += sizes[i];
    }
  }
  if (strict) {
    const Plan plan = build_plan(d, s, *current_capabilities());
    if (plan.leaves_fast_path()) {
      *why = plan.stock != Kind::None ? plan.stock : plan.fallback.front().kind;
      return std::nullopt;
    }
  }
  auto v = plan_and_run(d, s, false, false, /*bump=*/false);
  v.bumped = true;
  return v;
}

// The copy-out of checked arguments (src [outer, total, inner], out[i] [outer, sizes[i], inner],
// all contiguous): the CPU kernel's pass (fsdp/copy_out_kernel.h) where the device's capability is a
// host pass, else the planner; no capability, or a whole_list_only device (CUDA has stock kernels
// of its own): nullopt.
std::optional<CallResult> copy_out_served(const at::Tensor& src, c10::IntArrayRef sizes, at::TensorList out,
                                        int64_t outer, int64_t total, int64_t inner, bool strict, Kind* why) {
  const auto n = static_cast<int64_t>(out.size());
  int64_t nonempty = 0;
  for (const int64_t s : sizes) nonempty += s * inner > 0;
  CallResult v;
  v.executed = v.bumped = true;
  if (src.numel() == 0 || nonempty == 0) return v;
  const Kind route = fsdp_route(src.device());
  if (route == Kind::NoCapability || route == Kind::WholeListOp) {
    *why = route;
    return std::nullopt;
  }
  const int64_t pairs = outer * nonempty;
  if (route == Kind::None) {
    CpuCopyBatch batch;
    CopyOp op = CopyOp::Memcpy;
    bool mergeable = true;
    if (!batch.dtype_op(src.scalar_type(), src.scalar_type(), &op, &mergeable) || op != CopyOp::Memcpy) {
      *why = Kind::Dtype;
      return std::nullopt;
    }
    const int64_t esize = static_cast<int64_t>(src.element_size());
    CopyOutLayout layout;
    layout.src = static_cast<const char*>(src.const_data_ptr());
    layout.rows = outer;
    layout.pieces.reserve(nonempty);
    for (int64_t i = 0; i < n; ++i) {
      if (sizes[i] * inner > 0) layout.add(static_cast<char*>(out[i].data_ptr()), sizes[i] * inner * esize);
    }
    {
      RECORD_FUNCTION("npu_dispatch::cpu_kernel", std::vector<c10::IValue>());
      copy_out_pass(layout);
    }
    v.path(kForeach).add(pairs, outer * layout.row_bytes, 1);
    return v;
  }
  return device_rows(src, sizes, out, outer, total, inner, pairs, strict, why);
}

bool all_contiguous(at::TensorList a, at::TensorList b) {
  for (const auto l : {a, b}) {
    for (const auto& t : l) {
      if (!t.is_contiguous()) return false;
    }
  }
  return true;
}

}  // namespace

std::optional<CallResult> copy_out(const at::Tensor& src, c10::IntArrayRef sizes,
                                                          int64_t dim, at::TensorList out, bool strict, bool bump,
                                                          Kind* why) {
  RECORD_FUNCTION("npu_dispatch::split_with_sizes_copy", std::vector<c10::IValue>());
  const auto n = static_cast<int64_t>(out.size());
  // The rule for every tensor first (stock's autograd kernel raises for an out= argument that
  // requires grad before its kernel checks anything), then stock's own checks.
  const RuleContext rule = RuleContext::here(c10::GradMode::is_enabled());
  Refusal r = fast_route_tensor(src, false, rule);
  for (int64_t i = 0; i < n && !r; ++i) r = fast_route_tensor(out[i], true, rule);
  if (r) {
    *why = r.kind;
    return std::nullopt;
  }
  *why = Kind::MayRaise;
  bool ok = src.dim() > 0 && n == static_cast<int64_t>(sizes.size());
  int64_t wrapped = 0, outer = 1, inner = 1, total = 0;
  if (ok) {
    ok = dim >= -src.dim() && dim < src.dim();
    wrapped = dim < 0 ? dim + src.dim() : dim;
  }
  if (ok) {
    for (const int64_t s : sizes) {
      ok = ok && s >= 0;
      total += s;
    }
    ok = ok && total == src.size(wrapped);
    for (int64_t k = 0; k < wrapped; ++k) outer *= src.size(k);
    for (int64_t k = wrapped + 1; k < src.dim(); ++k) inner *= src.size(k);
  }
  std::vector<Span> written;
  if (ok) {
    auto want = src.sizes().vec();
    for (int64_t i = 0; i < n && ok; ++i) {
      want[wrapped] = sizes[i];
      const auto& o = out[i];
      ok = o.scalar_type() == src.scalar_type() && o.device() == src.device() && o.sizes() == c10::IntArrayRef(want);
      if (ok && o.numel() > 0) written.push_back(contiguous_span(o));
    }
  }
  if (!ok) return std::nullopt;
  // A span is exact only where its tensor is contiguous: contiguity before aliasing.
  if (!all_contiguous({src}, out)) {
    *why = Kind::NotContiguous;
    return std::nullopt;
  }
  if (writes_overlap(written, {contiguous_span(src)})) {
    *why = Kind::Aliasing;
    return std::nullopt;
  }
  auto counts = copy_out_served(src, sizes, out, outer, total, inner, strict, why);
  if (counts && bump) bump_as_stock(out, {src}, rule.in_inference);
  return counts;
}

namespace {

// What chunk_cat's checks need of every input: the same for the whole list.
struct ChunkCheck {
  caffe2::TypeMeta meta;  // t0's dtype: every input's
  int64_t elem;
  c10::Device device;
  RuleContext rule;  // the calling thread's
  bool on_cpu, pow2;
  int shift;  // log2(num_chunks) where pow2
  int64_t dim, wrapped, nd0, num_chunks, pre;
  c10::IntArrayRef lead;  // t0's sizes before dim: every input's
  Span out_span;
};

// The checks of a run of inputs and what they found.
struct ChunkScan {
  // The first tensor the rule refuses (its reason), or one stock may raise on or this pass does
  // not take (may_raise): the call is stock's.
  Kind refused = Kind::None;
  bool contiguous = true, aliased = false;
  int64_t width = 0, in_numel = 0, pairs = 0;

  void add(const ChunkScan& o) {
    if (refused == Kind::None) refused = o.refused;
    contiguous = contiguous && o.contiguous;
    aliased = aliased || o.aliased;
    width += o.width, in_numel += o.in_numel, pairs += o.pairs;
  }
};

// Stock's preconditions and the layout of inputs [k0, k1): their sources, at offsets counted from
// the first of them. Each tensor's fields are read from its TensorImpl directly, without the
// accessors' policy checks; the rule's tensor half (planner/classify.h) for each. Stops at the
// first tensor refused; never throws.
ChunkScan scan_chunks(at::TensorList tensors, int64_t k0, int64_t k1, const ChunkCheck& c, ChunkSource* sources) {
  ChunkScan s;
  try {
    for (int64_t k = k0; k < k1; ++k) {
      const auto& t = tensors[k];
      const c10::TensorImpl* ti = t.unsafeGetTensorImpl();
      if (const Refusal r = fast_route_tensor(*ti, false, c.rule)) {
        s.refused = r.kind;
        return s;
      }
      if (ti->dtype() != c.meta || ti->numel() == 0 || ti->device_type() != c.device.type() ||
          (!c.on_cpu && t.device() != c.device) || !ti->unsafe_storage()) {
        s.refused = Kind::MayRaise;
        return s;
      }
      // A negative dim needs every tensor of t0's ndim (stock wraps it by that), a non-negative one
      // fewer dims than each.
      const auto sizes = ti->sizes();
      const auto nd = static_cast<int64_t>(sizes.size());
      bool same_lead = c.dim < 0 ? nd == c.nd0 : c.wrapped < nd;
      for (int64_t d = 0; same_lead && d < c.wrapped; ++d) same_lead = sizes[d] == c.lead[d];
      if (!same_lead) {
        s.refused = Kind::MayRaise;
        return s;
      }
      const int64_t rows = sizes[c.wrapped];
      int64_t post = 1;
      for (int64_t d = c.wrapped + 1; d < nd; ++d) post *= sizes[d];
      const int64_t chunk =
          c.pow2 ? (rows + c.num_chunks - 1) >> c.shift : (rows + c.num_chunks - 1) / c.num_chunks;
      s.contiguous = s.contiguous && ti->is_contiguous();
      const auto start = reinterpret_cast<int64_t>(ti->unsafe_storage().data()) + ti->storage_offset() * c.elem;
      const int64_t end = start + ti->numel() * c.elem;
      // The library's overlap rule (planner/spans.h) for one destination: out.
      s.aliased = s.aliased || spans_meet({static_cast<uintptr_t>(start), static_cast<uintptr_t>(end)}, c.out_span);
      sources[k] = {reinterpret_cast<const char*>(start), rows * post, chunk * post, s.width};
      s.width += chunk * post;
      s.in_numel += c.pre * rows * post;
      // ceil(rows / chunk) chunks hold data: all of them unless the last are only padding (a
      // division only then).
      s.pairs += c.pre * (rows > (c.num_chunks - 1) * chunk ? c.num_chunks : (rows + chunk - 1) / chunk);
    }
  } catch (...) {  // a tensor whose sizes cannot be read plainly (symbolic): stock's
    s.refused = Kind::MayRaise;
  }
  return s;
}

// Why the call stays stock's, in the order stock's op meets the reasons, or nullopt where the pass
// writes it. `cast_ok`: false where the CPU kernel refuses an input's dtype into out's (asked only
// where `late` is unset); `late`: the refusal that comes after every tensor's (a device without
// the CPU kernel's pass).
std::optional<Kind> chunk_refusal(const ChunkScan& s, const at::Tensor& out, const ChunkCheck& c, bool cast_ok,
                                  std::optional<Kind> late) {
  if (s.refused != Kind::None) return s.refused;
  const auto os = out.sizes();
  const auto nl = static_cast<int64_t>(c.lead.size());
  bool shape = static_cast<int64_t>(os.size()) == nl + 2 && os[nl] == c.num_chunks && os[nl + 1] == s.width;
  for (int64_t d = 0; shape && d < nl; ++d) shape = os[d] == c.lead[d];
  if (!shape) return Kind::MayRaise;
  // An input's span is exact only where it is contiguous: contiguity before aliasing.
  if (!s.contiguous) return Kind::NotContiguous;
  if (s.aliased) return Kind::Aliasing;
  if (!cast_ok) return Kind::Dtype;
  return late;
}

// chunk_cat's checks for a list led by t0 (dim already checked against t0's dims), with
// the rule's thread state `rule`.
ChunkCheck chunk_check(const at::Tensor& t0, const at::Tensor& out, int64_t dim, int64_t num_chunks,
                       const RuleContext& rule) {
  const int64_t nd0 = t0.dim();
  const int64_t wrapped = dim < 0 ? dim + nd0 : dim;
  const bool pow2 = (num_chunks & (num_chunks - 1)) == 0;  // FSDP2's world sizes usually are
  ChunkCheck c{t0.dtype(),
               static_cast<int64_t>(t0.dtype().itemsize()),
               out.device(),
               rule,
               out.device().is_cpu(),
               pow2,
               pow2 ? __builtin_ctzll(static_cast<unsigned long long>(num_chunks)) : 0,
               dim,
               wrapped,
               nd0,
               num_chunks,
               1,
               t0.sizes().slice(0, wrapped),
               contiguous_span(out)};  // only out is written: inputs may overlap each other, not out
  for (const int64_t s : c.lead) c.pre *= s;
  return c;
}

// The call-level preconditions before any input is read: the rule for out, num_chunks bounded so
// that (size + num_chunks - 1) cannot overflow, a dim within t0's dims (past them stock raises for
// t0, and the check's lead holds only t0's sizes). Kind::None where they hold.
Kind chunk_call_refusal(at::TensorList tensors, int64_t dim, int64_t num_chunks, const at::Tensor& out,
                        const RuleContext& rule) {
  if (tensors.empty() || !tensors[0].defined()) return Kind::MayRaise;
  if (const Refusal r = fast_route_tensor(out, true, rule)) return r.kind;
  const int64_t nd0 = tensors[0].dim();
  const bool ok = num_chunks >= 1 && num_chunks <= (int64_t{1} << 40) && nd0 > 0 && dim >= -nd0 && dim < nd0;
  return ok ? Kind::None : Kind::MayRaise;
}

// A served chunk_cat's result, after its kernel counters (one pass of `pairs` pieces over out's
// bytes, whatever the passes per input dtype; out's bytes streamed where any pass streamed) and
// out's bump (with `bump`).
CallResult chunk_cat_served(at::TensorList tensors, int64_t pairs, const at::Tensor& out, int64_t passes,
                            bool streamed, bool bump, const RuleContext& rule) {
  const auto out_bytes = static_cast<int64_t>(out.nbytes());
  count_pass(pairs, out_bytes, streamed ? out_bytes : 0);
  if (bump) bump_as_stock({out}, tensors, rule.in_inference);
  CallResult v;
  v.executed = v.bumped = true;
  v.path(kForeach).add(pairs, static_cast<int64_t>(out.nbytes()), passes);
  return v;
}

// chunk_cat's pass over out: stock's checks for every input (chunk_call_refusal, scan_chunks,
// chunk_refusal), then one kernel pass per input dtype. `mixed`: chunk_cat_mixed_dtype, whose
// inputs may differ in dtype (upstream casts each to out's dtype first, through copy_); else
// every input has t0's dtype (another is stock's to raise on: may_raise). `rule`: the calling
// thread's state, with grad_check where stock's out= autograd kernel would raise.
std::optional<CallResult> chunk_cat_pass(at::TensorList tensors, int64_t dim, int64_t num_chunks, const at::Tensor& out,
                                         bool bump, Kind* why, const RuleContext& rule, bool mixed) {
  *why = chunk_call_refusal(tensors, dim, num_chunks, out, rule);
  if (*why != Kind::None) return std::nullopt;
  *why = Kind::MayRaise;
  const auto n = static_cast<int64_t>(tensors.size());
  const auto out_dt = out.scalar_type();
  ChunkCheck c = chunk_check(tensors[0], out, dim, num_chunks, rule);
  std::optional<Kind> late;
  if (const Kind route = fsdp_route(c.device); route != Kind::None) late = route;
  // One dtype: cat copies each input into a slice of out; where that slice is contiguous (one
  // input, or one row of out), its cast is copy_'s (FBGEMM's split for fp16), not ATen's copy
  // kernel's. Mixed: every cast is copy_'s.
  const bool through_cat = !mixed && n > 1 && c.pre * num_chunks > 1;
  std::vector<c10::ScalarType> dtypes;
  std::vector<ChunkCatKernel> kernels;
  bool cast_ok = true;
  ChunkScan scan;  // out's part of the findings
  scan.contiguous = out.is_contiguous();
  std::vector<ChunkSource> sources(n);
  int64_t in_bytes = 0;
  // Runs of inputs of one dtype, each checked in one scan (not mixed: the whole list).
  for (int64_t k0 = 0, k1 = 0; k0 < n && scan.refused == Kind::None; k0 = k1) {
    const auto& t = tensors[k0];
    if (!t.defined()) {  // past tensors[0], which chunk_call_refusal checked
      scan.refused = Kind::MayRaise;
      break;
    }
    const auto dt = t.scalar_type();
    k1 = mixed ? k0 + 1 : n;
    while (k1 < n && tensors[k1].defined() && tensors[k1].scalar_type() == dt) ++k1;
    if (std::find(dtypes.begin(), dtypes.end(), dt) == dtypes.end()) {
      dtypes.push_back(dt);
      kernels.emplace_back();
      // The kernel takes one dtype (not bool, not quantized) or bf16 / fp16 -> fp32: any other
      // cast is cat_out's to check (it refuses what cannot be cast) and to round.
      if (!late && cast_ok) cast_ok = kernels.back().init(dt, out_dt, through_cat);
    }
    c.meta = t.dtype();
    c.elem = static_cast<int64_t>(t.dtype().itemsize());
    const int64_t base = scan.width;
    const ChunkScan run = scan_chunks(tensors, k0, k1, c, sources.data());
    for (int64_t k = k0; k < k1 && base > 0; ++k) sources[k].offset += base;
    in_bytes += run.in_numel * c.elem;
    scan.add(run);
  }
  if (const auto refusal = chunk_refusal(scan, out, c, cast_ok, late)) {
    *why = *refusal;
    return std::nullopt;
  }
  // out's mutable pointer only once nothing refuses the call (it materializes a copy-on-write
  // out, which stock leaves as it is where it raises).
  char* const out_ptr = static_cast<char*>(out.data_ptr());
  const int64_t out_numel = out.numel();
  const int64_t moved = in_bytes + out_numel * static_cast<int64_t>(c10::elementSize(out_dt));
  bool streamed = false;
  {
    RECORD_FUNCTION("npu_dispatch::cpu_kernel", std::vector<c10::IValue>());
    for (size_t g = 0; g < dtypes.size(); ++g) {
      ChunkCatLayout layout{out_ptr, c.pre, num_chunks, scan.width, dtypes[g], out_dt, {}};
      if (dtypes.size() == 1) {
        layout.sources = std::move(sources);
      } else {
        for (int64_t k = 0; k < n; ++k) {
          if (tensors[k].scalar_type() == dtypes[g]) layout.sources.push_back(sources[k]);
        }
      }
      streamed = kernels[g].pass(layout, out_numel, moved) > 0 || streamed;
    }
  }
  return chunk_cat_served(tensors, scan.pairs, out, static_cast<int64_t>(dtypes.size()), streamed, bump, rule);
}

}  // namespace

std::optional<CallResult> chunk_cat(at::TensorList tensors, int64_t dim, int64_t num_chunks,
                                   const at::Tensor& out, bool strict, bool bump, Kind* why,
                                   bool autograd_check) {
  RECORD_FUNCTION("npu_dispatch::chunk_cat", std::vector<c10::IValue>());
  (void)strict;  // every call served is one kernel pass: nothing for strict to refuse
  const RuleContext rule = RuleContext::here(autograd_check && c10::GradMode::is_enabled());
  return chunk_cat_pass(tensors, dim, num_chunks, out, bump, why, rule, /*mixed=*/false);
}

std::optional<CallResult> chunk_cat_mixed(at::TensorList tensors, int64_t dim, int64_t num_chunks,
                                         const at::Tensor& out, bool strict, bool bump, Kind* why) {
  RECORD_FUNCTION("npu_dispatch::chunk_cat_mixed_dtype", std::vector<c10::IValue>());
  *why = Kind::MayRaise;
  if (tensors.empty() || !tensors[0].defined()) return std::nullopt;
  bool mixed = false;
  for (const auto& t : tensors) mixed = mixed || !t.defined() || t.scalar_type() != tensors[0].scalar_type();
  // One dtype: upstream's kernel is _chunk_cat.out itself. Mixed: upstream's op runs below
  // autograd (it has no autograd kernel), so no out= autograd check.
  if (!mixed) return chunk_cat(tensors, dim, num_chunks, out, strict, bump, why, /*autograd_check=*/false);
  return chunk_cat_pass(tensors, dim, num_chunks, out, bump, why, RuleContext::here(), /*mixed=*/true);
}

namespace {

// A served call's result; a refused one runs stock's op here, or under `strict` writes nothing.
template <typename Serve, typename Stock>
CallResult serve_or_stock(bool strict, int64_t pairs, Serve serve, Stock stock) {
  Kind why = Kind::MayRaise;
  if (auto served = serve(&why)) return *served;
  if (strict) return blocked_counts(why, pairs);
  StockCall counted_here;  // stock's op, and any owned op it calls, pass the interception by
  return stock_counts(why, pairs, stock());
}

}  // namespace

CallResult copy_out_or_stock(const at::Tensor& src, c10::IntArrayRef sizes, int64_t dim, at::TensorList out,
                             bool strict, bool bump) {
  return serve_or_stock(
      strict, static_cast<int64_t>(out.size()),
      [&](Kind* why) { return copy_out(src, sizes, dim, out, strict, bump, why); },
      [&] {
        at::split_with_sizes_copy_out(out, src, sizes, dim);
        // Stock's out= op called from the caller's level bumps the outs as its ADInplaceOrView
        // kernel would (planner/classify.h bump_as_stock); this level is below it.
        if (bump && !bumps_here()) bump_as_stock(out, {src}, c10::InferenceMode::is_enabled());
        return total_bytes(out);
      });
}

CallResult chunk_cat_or_stock(at::TensorList tensors, int64_t dim, int64_t num_chunks, const at::Tensor& out,
                              bool strict, bool bump, bool mixed) {
  return serve_or_stock(
      strict, static_cast<int64_t>(tensors.size()),
      [&](Kind* why) {
        return mixed ? chunk_cat_mixed(tensors, dim, num_chunks, out, strict, false, why)
                     : chunk_cat(tensors, dim, num_chunks, out, strict, bump, why);
      },
      [&] {
        if (mixed) {
          static const auto op =
              c10::Dispatcher::singleton()
                  .findSchemaOrThrow("fsdp::chunk_cat_mixed_dtype", "")
                  .typed<void(at::TensorList, int64_t, int64_t, at::Tensor&)>();
          at::Tensor o = out;
          op.call(tensors, dim, num_chunks, o);
        } else {
          at::_chunk_cat_out(const_cast<at::Tensor&>(out), tensors, dim, num_chunks);
          if (bump && !bumps_here()) bump_as_stock({out}, tensors, c10::InferenceMode::is_enabled());
        }
        return total_bytes({out});
      });
}

}  // namespace npu_dispatch
