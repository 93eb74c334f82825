// FSDP2's all-gather copy-out and reduce-scatter copy-in (fsdp_copies.h): each call becomes a list
// of contiguous 1-D pieces, copied by the CPU kernel in one pass, or by the one planner as a
// _foreach_copy_ of piece views on a device; anything else is stock's op whole.
#include "fsdp_copies.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cstring>

#include "capability_table.h"
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

// One contiguous piece: `n` elements from src to dst (element offsets into the tensors' data),
// then `pad` zero elements after it in dst.
struct Piece {
  int64_t dst_tensor, src_tensor;
  int64_t dst_off, src_off, n, pad;
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

namespace {

class PieceCopy {
 public:
  // `narrowing`: whether a narrowing cast (fp32 -> bf16 / fp16) may run here. Stock's chunk_cat
  // casts inside cat, whose NaN bits differ from copy_'s (which the CPU kernel reproduces).
  PieceCopy(at::TensorList dsts, at::TensorList srcs, std::vector<Piece> pieces, bool narrowing)
      : dsts_(dsts), srcs_(srcs), pieces_(std::move(pieces)), narrowing_(narrowing) {}

  // The CPU kernel's pass over every piece; false (nothing written) where a dtype pair is not
  // one it reproduces bit for bit.
  bool cpu(std::vector<int64_t>* v) {
    // Each tensor's address, element size and dtype once: pieces index them.
    struct Side {
      char* ptr;
      int64_t esize;
      c10::ScalarType dtype;
    };
    std::vector<Side> ds, ss;
    ds.reserve(dsts_.size());
    ss.reserve(srcs_.size());
    for (const auto& d : dsts_) ds.push_back({static_cast<char*>(d.data_ptr()), static_cast<int64_t>(d.element_size()), d.scalar_type()});
    for (const auto& s : srcs_) {
      ss.push_back({const_cast<char*>(static_cast<const char*>(s.const_data_ptr())),
                    static_cast<int64_t>(s.element_size()), s.scalar_type()});
    }
    CpuCopyBatch batch;
    batch.reserve(pieces_.size());
    CopyOp op = CopyOp::Memcpy;
    bool mergeable = true;
    c10::ScalarType last_s = c10::ScalarType::Undefined, last_d = c10::ScalarType::Undefined;
    int64_t bytes = 0, pairs = 0;
    const char* prev_src_end = nullptr;
    char* prev_dst_end = nullptr;
    for (const auto& p : pieces_) {
      const Side& d = ds[p.dst_tensor];
      const Side& s = ss[p.src_tensor];
      if (s.dtype != last_s || d.dtype != last_d) {
        if (!batch.route(s.dtype, d.dtype, &op, &mergeable)) return false;
        // FBGEMM's fp16 -> fp32 split depends on where stock's copy starts and ends: not one of ours.
        if (!mergeable) return false;
        if (!narrowing_ && (op == CopyOp::F32ToBF16 || op == CopyOp::F32ToF16)) return false;
        last_s = s.dtype;
        last_d = d.dtype;
        prev_dst_end = nullptr;
      }
      if (p.n == 0) continue;
      char* dp = d.ptr + p.dst_off * d.esize;
      const char* sp = s.ptr + p.src_off * s.esize;
      const int64_t n = op == CopyOp::Memcpy ? p.n * d.esize : p.n;
      batch.add_contiguous(dp, sp, n, op, dp == prev_dst_end && sp == prev_src_end);
      prev_dst_end = dp + p.n * d.esize;
      prev_src_end = sp + p.n * s.esize;
      bytes += p.n * d.esize;
      ++pairs;
    }
    // Padding: stock pads with zeros of the input dtype before its cast; +0 is all-zero bits.
    for (const auto& p : pieces_) {
      if (p.pad == 0) continue;
      const Side& d = ds[p.dst_tensor];
      std::memset(d.ptr + (p.dst_off + p.n) * d.esize, 0, p.pad * d.esize);
      bytes += p.pad * d.esize;
    }
    {
      RECORD_FUNCTION("npu_dispatch::cpu_kernel", std::vector<c10::IValue>());
      batch.run();
    }
    v->assign(kCountsLen, 0);
    (*v)[0] = kExecuted | kBumped;
    (*v)[path_slot(kForeach, 0)] = pairs;
    (*v)[path_slot(kForeach, 1)] = bytes;
    (*v)[path_slot(kForeach, 2)] = 1;
    return true;
  }

  // A device: one zero fill of each padded destination, then the pieces as one _foreach_copy_
  // of 1-D views through the planner (its groups, stages and the device's batched kernel).
  // Under `strict`, a plan with any pair off the fast path writes nothing (nullopt).
  std::optional<std::vector<int64_t>> device(bool strict, Kind* why) {
    at::AutoDispatchBelowADInplaceOrView below;  // internal views and fills move no counter
    std::vector<at::Tensor> d, s;
    d.reserve(pieces_.size());
    s.reserve(pieces_.size());
    std::vector<uint8_t> padded(dsts_.size(), 0);
    for (const auto& p : pieces_) {
      if (p.pad != 0) padded[p.dst_tensor] = 1;
      if (p.n == 0) continue;
      const auto& dt = dsts_[p.dst_tensor];
      const auto& st = srcs_[p.src_tensor];
      d.push_back(dt.as_strided({p.n}, {1}, dt.storage_offset() + p.dst_off));
      s.push_back(st.as_strided({p.n}, {1}, st.storage_offset() + p.src_off));
    }
    if (strict && !d.empty()) {
      const Plan plan = build_plan(d, s, *current_capabilities());
      if (plan.stock != Kind::None || !plan.fallback.empty()) {
        *why = plan.stock != Kind::None ? plan.stock : plan.fallback.front().kind;
        return std::nullopt;
      }
    }
    int64_t fills = 0;
    for (size_t k = 0; k < dsts_.size(); ++k) {
      if (padded[k]) {
        auto t = dsts_[k];
        t.zero_();
        ++fills;
      }
    }
    std::vector<int64_t> v(kCountsLen, 0);
    if (!d.empty()) v = plan_and_run(d, s, false, false, /*bump=*/false);
    v[0] = kExecuted | kBumped;
    // The fills count with the path that took the pieces (the one with most of them).
    int best = kForeach;
    for (int p = 0; p < kNumPaths; ++p) {
      if (v[path_slot(static_cast<Path>(p), 0)] > v[path_slot(static_cast<Path>(best), 0)]) best = p;
    }
    v[path_slot(static_cast<Path>(best), 2)] += fills;
    return v;
  }

 private:
  at::TensorList dsts_, srcs_;
  std::vector<Piece> pieces_;
  bool narrowing_;
};

// The CPU kernel where the device's capability is a host pass, else the planner; no capability,
// or a whole_list_only device (CUDA has stock kernels of its own for both ops): nullopt.
std::optional<std::vector<int64_t>> run_pieces(at::TensorList dsts, at::TensorList srcs, std::vector<Piece> pieces,
                                               c10::Device device, bool strict, bool narrowing, bool on_device,
                                               Kind* why) {
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
  if (!narrowing && dsts[0].element_size() < srcs[0].element_size()) {
    *why = Kind::Dtype;
    return std::nullopt;
  }
  if (!cap->host_pass && !on_device) {
    // The device's own op is one call (a zero fill, the pad copies and one cat under stock); its
    // pieces through the planner would issue more launches than that.
    *why = Kind::NoCapability;
    return std::nullopt;
  }
  PieceCopy copy(dsts, srcs, std::move(pieces), narrowing);
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
        pieces.push_back({i, 0, o * sizes[i] * inner, (o * total + off) * inner, sizes[i] * inner, 0});
      }
      off += sizes[i];
    }
  }
  auto counts = run_pieces(out, {src}, std::move(pieces), src.device(), strict, /*narrowing=*/true,
                           /*on_device=*/true, why);
  if (counts && bump) {
    for (const auto& o : out) o.unsafeGetTensorImpl()->bump_version();
  }
  return counts;
}

std::optional<std::vector<int64_t>> chunk_cat(at::TensorList tensors, int64_t dim, int64_t num_chunks,
                                              const at::Tensor& out, bool strict, bool bump, Kind* why) {
  RECORD_FUNCTION("npu_dispatch::chunk_cat", std::vector<c10::IValue>());
  const auto n = static_cast<int64_t>(tensors.size());
  *why = Kind::MayRaise;
  // num_chunks bounded so that (size + num_chunks - 1) cannot overflow.
  bool ok = n > 0 && num_chunks >= 1 && num_chunks <= (int64_t{1} << 40) && plain(out);
  int64_t wrapped = dim;
  if (ok) {
    const auto& t0 = tensors[0];
    bool same_ndim = true;
    for (const auto& t : tensors) {
      ok = ok && plain(t) && t.numel() > 0 && t.scalar_type() == t0.scalar_type() &&
           t.device() == t0.device() && t.device() == out.device();
      same_ndim = same_ndim && ok && t.dim() == t0.dim();
    }
    if (ok && same_ndim) {
      ok = t0.dim() > 0 && dim >= -t0.dim() && dim < t0.dim();
      wrapped = dim < 0 ? dim + t0.dim() : dim;
    } else if (ok) {
      ok = dim >= 0;
      for (const auto& t : tensors) ok = ok && dim < t.dim();
    }
    for (const auto& t : tensors) {
      for (int64_t k = 0; ok && k < wrapped; ++k) ok = t.size(k) == t0.size(k);
    }
  }
  int64_t pre = 1, width = 0;
  std::vector<int64_t> chunk(n), post(n), offset(n);
  if (ok) {
    const auto& t0 = tensors[0];
    for (int64_t k = 0; k < wrapped; ++k) pre *= t0.size(k);
    for (int64_t i = 0; i < n; ++i) {
      const auto& t = tensors[i];
      chunk[i] = (t.size(wrapped) + num_chunks - 1) / num_chunks;
      post[i] = 1;
      for (int64_t k = wrapped + 1; k < t.dim(); ++k) post[i] *= t.size(k);
      offset[i] = width;
      width += chunk[i] * post[i];
    }
    std::vector<int64_t> want(t0.sizes().begin(), t0.sizes().begin() + wrapped);
    want.push_back(num_chunks);
    want.push_back(width);
    ok = out.sizes() == c10::IntArrayRef(want);
    if (ok) {
      std::vector<Span> spans{span_of(out)};
      for (const auto& t : tensors) spans.push_back(span_of(t));
      if (any_overlap(spans)) {
        ok = false;
        *why = Kind::Aliasing;
      }
    }
  }
  if (!ok) return std::nullopt;
  // One dtype, or a widening float cast: any other cast is cat_out's to check (it refuses what
  // cannot be cast) and to round (its NaN bits are not copy_'s).
  const auto in_dt = tensors[0].scalar_type(), out_dt = out.scalar_type();
  if (in_dt != out_dt && !(at::isFloatingType(in_dt) && at::isFloatingType(out_dt) &&
                           c10::elementSize(out_dt) > c10::elementSize(in_dt))) {
    *why = Kind::Dtype;
    return std::nullopt;
  }
  if (needs_autograd(tensors, {out})) {
    *why = Kind::Subclass;
    return std::nullopt;
  }
  if (!all_contiguous(tensors, {out})) {
    *why = Kind::NotDense;
    return std::nullopt;
  }
  std::vector<Piece> pieces;
  pieces.reserve(pre * num_chunks * n);
  for (int64_t p = 0; p < pre; ++p) {
    for (int64_t c = 0; c < num_chunks; ++c) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t rows = tensors[i].size(wrapped);
        const int64_t valid = std::clamp<int64_t>(rows - c * chunk[i], 0, chunk[i]);
        pieces.push_back({0, i, (p * num_chunks + c) * width + offset[i], (p * rows + c * chunk[i]) * post[i],
                          valid * post[i], (chunk[i] - valid) * post[i]});
      }
    }
  }
  auto counts = run_pieces({out}, tensors, std::move(pieces), out.device(), strict, /*narrowing=*/false,
                           /*on_device=*/false, why);
  if (counts && bump) out.unsafeGetTensorImpl()->bump_version();
  return counts;
}

}  // namespace npu_dispatch
