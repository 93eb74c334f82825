// FSDP2's all-gather copy-out and reduce-scatter copy-in (fsdp_copies.h): the checks stock's ops
// make, then the copy-out as contiguous 1-D pieces (one CPU kernel pass, or the one planner as a
// _foreach_copy_ of piece views on a device) and chunk_cat as one pass of chunk_cat_kernel.h;
// anything else is stock's op whole.
#include "fsdp_copies.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>

#include "capability_table.h"
#include "chunk_cat_kernel.h"
#include "copy_call.h"
#include "cpu_copy_kernel.h"
#include "execute.h"
#include "plan.h"

namespace npu_dispatch {
namespace {

// A tensor the pieces may address directly: plain strided (contiguity is checked apart, for its
// reason), with a version counter, no lazy bit, not meta.
bool plain(const at::Tensor& t) {
  if (is_subclass(t) || t.layout() != at::kStrided || t.is_meta() || t.is_conj() || t.is_neg()) return false;
  return has_version_counter(t) && copy_dtype(t.scalar_type());
}

struct Span {
  int64_t start, end;
};

// Whether any two spans overlap (each tensor's [data, data + nbytes)).
bool any_overlap(std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  for (size_t k = 1; k < spans.size(); ++k) {
    if (spans[k].start < spans[k - 1].end) return true;
  }
  return false;
}

Span span_of(const at::Tensor& t) {
  const auto p = reinterpret_cast<int64_t>(t.const_data_ptr());
  return {p, p + static_cast<int64_t>(t.numel() * t.element_size())};
}

// One contiguous piece of the copy-out: `n` elements from src to dst (element offsets into the
// tensors' data; one dtype).
struct Piece {
  int64_t dst_tensor, src_tensor;
  int64_t dst_off, src_off, n;
};

}  // namespace

std::vector<int64_t> stock_counts(Kind kind, int64_t pairs, int64_t bytes) {
  std::vector<int64_t> v(kCountsLen, 0);
  v[0] = kExecuted | kBumped;
  v[path_slot(kStock, 0)] = pairs;
  v[path_slot(kStock, 1)] = bytes;
  v[path_slot(kStock, 2)] = pairs;
  v[reason_slot(kind)] = pairs;
  return v;
}

int64_t total_bytes(at::TensorList ts) {
  int64_t b = 0;
  for (const auto& t : ts) b += t.numel() * static_cast<int64_t>(t.element_size());
  return b;
}

namespace {

class PieceCopy {
 public:
  PieceCopy(at::TensorList dsts, at::TensorList srcs, std::vector<Piece> pieces)
      : dsts_(dsts), srcs_(srcs), pieces_(std::move(pieces)) {}

  // The CPU kernel's pass over every piece (byte copies, adjacent pieces merged); false (nothing
  // written) where the dtype is not one it copies as bytes.
  bool cpu(std::vector<int64_t>* v) {
    CpuCopyBatch batch;
    CopyOp op = CopyOp::Memcpy;
    bool mergeable = true;
    if (!batch.route(srcs_[0].scalar_type(), dsts_[0].scalar_type(), &op, &mergeable) || op != CopyOp::Memcpy) {
      return false;
    }
    const int64_t esize = static_cast<int64_t>(dsts_[0].element_size());
    std::vector<char*> ds;
    std::vector<const char*> ss;
    ds.reserve(dsts_.size());
    ss.reserve(srcs_.size());
    for (const auto& d : dsts_) ds.push_back(static_cast<char*>(d.data_ptr()));
    for (const auto& s : srcs_) ss.push_back(static_cast<const char*>(s.const_data_ptr()));
    batch.reserve(pieces_.size());
    int64_t bytes = 0;
    const char* prev_src_end = nullptr;
    char* prev_dst_end = nullptr;
    for (const auto& p : pieces_) {
      char* dp = ds[p.dst_tensor] + p.dst_off * esize;
      const char* sp = ss[p.src_tensor] + p.src_off * esize;
      const int64_t nb = p.n * esize;
      batch.add_contiguous(dp, sp, nb, op, dp == prev_dst_end && sp == prev_src_end);
      prev_dst_end = dp + nb;
      prev_src_end = sp + nb;
      bytes += nb;
    }
    {
      RECORD_FUNCTION("npu_dispatch::cpu_kernel", std::vector<c10::IValue>());
      batch.run();
    }
    v->assign(kCountsLen, 0);
    (*v)[0] = kExecuted | kBumped;
    (*v)[path_slot(kForeach, 0)] = static_cast<int64_t>(pieces_.size());
    (*v)[path_slot(kForeach, 1)] = bytes;
    (*v)[path_slot(kForeach, 2)] = 1;
    return true;
  }

  // A device: the pieces as one _foreach_copy_ of 1-D views through the planner (its groups,
  // stages and the device's batched kernel). Under `strict`, a plan with any pair off the fast
  // path writes nothing (nullopt).
  std::optional<std::vector<int64_t>> device(bool strict, Kind* why) {
    at::AutoDispatchBelowADInplaceOrView below;  // internal views move no counter
    std::vector<at::Tensor> d, s;
    d.reserve(pieces_.size());
    s.reserve(pieces_.size());
    for (const auto& p : pieces_) {
      const auto& dt = dsts_[p.dst_tensor];
      const auto& st = srcs_[p.src_tensor];
      d.push_back(dt.as_strided({p.n}, {1}, dt.storage_offset() + p.dst_off));
      s.push_back(st.as_strided({p.n}, {1}, st.storage_offset() + p.src_off));
    }
    if (strict) {
      const Plan plan = build_plan(d, s, *current_capabilities());
      if (plan.stock != Kind::None || !plan.fallback.empty()) {
        *why = plan.stock != Kind::None ? plan.stock : plan.fallback.front().kind;
        return std::nullopt;
      }
    }
    auto v = plan_and_run(d, s, false, false, /*bump=*/false);
    v[0] = kExecuted | kBumped;
    return v;
  }

 private:
  at::TensorList dsts_, srcs_;
  std::vector<Piece> pieces_;
};

// The CPU kernel where the device's capability is a host pass, else the planner; no capability,
// or a whole_list_only device (CUDA has stock kernels of its own): nullopt.
std::optional<std::vector<int64_t>> run_pieces(at::TensorList dsts, at::TensorList srcs, std::vector<Piece> pieces,
                                               c10::Device device, bool strict, Kind* why) {
  if (pieces.empty()) {
    std::vector<int64_t> v(kCountsLen, 0);
    v[0] = kExecuted | kBumped;
    return v;
  }
  const auto caps = current_capabilities();
  const Capability* cap = caps->get(device.type());
  if (cap == nullptr) {
    *why = Kind::NoCapability;
    return std::nullopt;
  }
  if (cap->whole_list) {
    *why = Kind::WholeListRoute;
    return std::nullopt;
  }
  PieceCopy copy(dsts, srcs, std::move(pieces));
  if (cap->host_pass) {
    std::vector<int64_t> v;
    if (copy.cpu(&v)) return v;
    *why = Kind::Dtype;
    return std::nullopt;
  }
  return copy.device(strict, why);
}

// Stock raises for an out= argument that requires grad (and records NotImplemented for a
// non-leaf): such calls are stock's.
bool needs_autograd(at::TensorList a, at::TensorList b) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const auto l : {a, b}) {
    for (const auto& t : l) {
      if (t.requires_grad()) return true;
    }
  }
  return false;
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

std::optional<std::vector<int64_t>> split_with_sizes_copy(const at::Tensor& src, c10::IntArrayRef sizes,
                                                          int64_t dim, at::TensorList out, bool strict, bool bump,
                                                          Kind* why) {
  RECORD_FUNCTION("npu_dispatch::split_with_sizes_copy", std::vector<c10::IValue>());
  const auto n = static_cast<int64_t>(out.size());
  *why = Kind::MayRaise;
  bool ok = plain(src) && src.dim() > 0 && n == static_cast<int64_t>(sizes.size());
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
  std::vector<Span> spans;
  if (ok) {
    spans.push_back(span_of(src));
    auto want = src.sizes().vec();
    for (int64_t i = 0; i < n && ok; ++i) {
      want[wrapped] = sizes[i];
      const auto& o = out[i];
      ok = plain(o) && o.scalar_type() == src.scalar_type() && o.device() == src.device() &&
           o.sizes() == c10::IntArrayRef(want);
      if (ok && o.numel() > 0) spans.push_back(span_of(o));
    }
    if (ok && any_overlap(spans)) {
      ok = false;
      *why = Kind::Aliasing;
    }
  }
  if (!ok) return std::nullopt;
  if (needs_autograd({src}, out)) {
    *why = Kind::Subclass;
    return std::nullopt;
  }
  if (!all_contiguous({src}, out)) {
    *why = Kind::NotDense;
    return std::nullopt;
  }
  std::vector<Piece> pieces;
  if (src.numel() > 0) pieces.reserve(outer * n);
  for (int64_t o = 0; o < outer && src.numel() > 0; ++o) {
    int64_t off = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (sizes[i] * inner > 0) {
        pieces.push_back({i, 0, o * sizes[i] * inner, (o * total + off) * inner, sizes[i] * inner});
      }
      off += sizes[i];
    }
  }
  auto counts = run_pieces(out, {src}, std::move(pieces), src.device(), strict, why);
  if (counts && bump) {
    for (const auto& o : out) o.unsafeGetTensorImpl()->bump_version();
  }
  return counts;
}

std::optional<std::vector<int64_t>> chunk_cat(at::TensorList tensors, int64_t dim, int64_t num_chunks,
                                              const at::Tensor& out, bool strict, bool bump, Kind* why) {
  RECORD_FUNCTION("npu_dispatch::chunk_cat", std::vector<c10::IValue>());
  (void)strict;  // every call served is one kernel pass: nothing for strict to refuse
  const auto n = static_cast<int64_t>(tensors.size());
  *why = Kind::MayRaise;
  // num_chunks bounded so that (size + num_chunks - 1) cannot overflow.
  if (n == 0 || num_chunks < 1 || num_chunks > (int64_t{1} << 40) || !plain(out)) return std::nullopt;
  // Stock's preconditions and the layout, in one pass over the tensors; the reasons after them
  // are decided in order below. A negative dim needs every tensor of t0's ndim (stock wraps it by
  // that), a non-negative one fewer dims than each.
  const auto& t0 = tensors[0];
  const auto in_dt = t0.scalar_type(), out_dt = out.scalar_type();
  const auto device = out.device();
  const int64_t nd0 = t0.dim();
  if (nd0 == 0 || dim < -nd0) return std::nullopt;
  const int64_t wrapped = dim < 0 ? dim + nd0 : dim;
  const auto lead = t0.sizes().slice(0, std::min(wrapped, nd0));
  // out's mutable pointer only once nothing refuses the call (it materializes a copy-on-write
  // out, which stock leaves as it is where it raises).
  ChunkCatLayout layout{nullptr, 1, num_chunks, 0, in_dt, out_dt, {}};
  for (const int64_t s : lead) layout.pre *= s;
  layout.sources.reserve(n);
  const bool grad_mode = c10::GradMode::is_enabled();
  bool grad = grad_mode && out.requires_grad(), contiguous = out.is_contiguous();
  // Only out is written: an input may alias another (both read), not out (cat_out raises).
  const Span out_span = span_of(out);
  bool aliased = false;
  // chunk = ceil(rows / num_chunks): a shift where num_chunks is a power of two (FSDP2's world
  // sizes usually are), else a division.
  const bool pow2 = (num_chunks & (num_chunks - 1)) == 0;
  const int shift = pow2 ? __builtin_ctzll(static_cast<unsigned long long>(num_chunks)) : 0;
  // Every input has t0's dtype and out's device, so plain()'s dtype and meta tests are made once
  // (t0's dtype here, out's device by plain(out)); each tensor's fields are read from its
  // TensorImpl directly, without the accessors' policy checks and virtual has_storage (their cost
  // on a long list: docs/notes/profile.md, "chunk_cat's pass").
  if (!copy_dtype(in_dt)) return std::nullopt;
  const caffe2::TypeMeta in_meta = t0.dtype();
  const auto elem = static_cast<int64_t>(in_meta.itemsize());
  const bool on_cpu = device.is_cpu();
  for (const auto& t : tensors) {
    const c10::TensorImpl* ti = t.unsafeGetTensorImpl();
    if (is_subclass(t) || t.layout() != at::kStrided || t.is_conj() || t.is_neg() || !has_version_counter(t) ||
        ti->dtype() != in_meta || ti->numel() == 0 || ti->device_type() != device.type() ||
        (!on_cpu && t.device() != device) || !ti->unsafe_storage()) {
      return std::nullopt;
    }
    const auto sizes = ti->sizes();
    const auto nd = static_cast<int64_t>(sizes.size());
    if (dim < 0 ? nd != nd0 : wrapped >= nd) return std::nullopt;
    for (int64_t k = 0; k < wrapped; ++k) {
      if (sizes[k] != lead[k]) return std::nullopt;
    }
    const int64_t rows = sizes[wrapped];
    int64_t post = 1;
    for (int64_t k = wrapped + 1; k < nd; ++k) post *= sizes[k];
    const int64_t chunk = pow2 ? (rows + num_chunks - 1) >> shift : (rows + num_chunks - 1) / num_chunks;
    grad = grad || (grad_mode && t.requires_grad());
    contiguous = contiguous && ti->is_contiguous();
    const auto start = reinterpret_cast<int64_t>(ti->unsafe_storage().data()) + ti->storage_offset() * elem;
    const int64_t end = start + ti->numel() * elem;
    aliased = aliased || (start < out_span.end && out_span.start < end);
    layout.sources.push_back({reinterpret_cast<const char*>(start), rows, chunk, post, layout.width});
    layout.width += chunk * post;
  }
  std::vector<int64_t> want(lead.begin(), lead.end());
  want.push_back(num_chunks);
  want.push_back(layout.width);
  if (out.sizes() != c10::IntArrayRef(want)) return std::nullopt;
  if (aliased) {
    *why = Kind::Aliasing;
    return std::nullopt;
  }
  // One dtype, or a widening float cast: any other cast is cat_out's to check (it refuses what
  // cannot be cast) and to round (its NaN bits are not copy_'s).
  if (in_dt != out_dt && !(at::isFloatingType(in_dt) && at::isFloatingType(out_dt) &&
                           c10::elementSize(out_dt) > c10::elementSize(in_dt))) {
    *why = Kind::Dtype;
    return std::nullopt;
  }
  // Stock raises for an out= argument that requires grad (and records NotImplemented for a
  // non-leaf): such calls are stock's.
  if (grad) {
    *why = Kind::Subclass;
    return std::nullopt;
  }
  if (!contiguous) {
    *why = Kind::NotDense;
    return std::nullopt;
  }
  // The CPU kernel where the device's capability is a host pass. Elsewhere the device's own op is
  // one call (a zero fill, the pad copies and one cat under stock); its pieces through the planner
  // would issue more launches than that. A whole_list_only device (CUDA) has a kernel of its own.
  const auto caps = current_capabilities();
  const Capability* cap = caps->get(device.type());
  if (cap == nullptr || cap->whole_list || !cap->host_pass) {
    *why = cap != nullptr && cap->whole_list ? Kind::WholeListRoute : Kind::NoCapability;
    return std::nullopt;
  }
  int64_t pairs = 0;
  layout.out = static_cast<char*>(out.data_ptr());
  if (!run_chunk_cat(layout, &pairs)) {
    *why = Kind::Dtype;
    return std::nullopt;
  }
  if (bump) out.unsafeGetTensorImpl()->bump_version();
  std::vector<int64_t> v(kCountsLen, 0);
  v[0] = kExecuted | kBumped;
  v[path_slot(kForeach, 0)] = pairs;
  v[path_slot(kForeach, 1)] = static_cast<int64_t>(out.nbytes());
  v[path_slot(kForeach, 2)] = 1;
  return v;
}

}  // namespace npu_dispatch
