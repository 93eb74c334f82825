#include "cpu/copy_kernel.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/Version.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include "cpu/byte_pass.h"
#include "cpu/convert.h"
#include "cpu/byte_copy.h"

namespace npu_dispatch {
namespace {

constexpr int kOps = static_cast<int>(CopyOp::Count);

struct OpConfig {
  const ConvertFns* fns = nullptr;  // nullptr: refused, stock copies it
  bool fbgemm_split = false;
};

}  // namespace

struct KernelConfig {
  std::array<OpConfig, kOps> ops{};
  // The variant whose fp16 -> fp32 widening is ATen's copy kernel's (its TensorIterator loop, which
  // stock's cat casts with: no FBGEMM split), checked against a strided copy_; nullptr: none.
  const ConvertFns* iterator_f16_to_f32 = nullptr;
};

namespace {

using Config = KernelConfig;

std::atomic<const Config*> g_config{nullptr};

const Config* published_config() {
  static const Config none{};
  const Config* c = g_config.load(std::memory_order_acquire);
  return c != nullptr ? c : &none;
}

// Each CopyOp's (source, destination) dtypes and name, by CopyOp value. A Memcpy item counts
// bytes (WorkItem::n): its dtypes here are one byte.
struct OpFacts {
  at::ScalarType src, dst;
  const char* name;
};
constexpr OpFacts kOpFacts[] = {{at::kByte, at::kByte, "memcpy"},
                                {at::kFloat, at::kBFloat16, "f32->bf16"},
                                {at::kBFloat16, at::kFloat, "bf16->f32"},
                                {at::kFloat, at::kHalf, "f32->f16"},
                                {at::kHalf, at::kFloat, "f16->f32"}};
static_assert(sizeof(kOpFacts) / sizeof(kOpFacts[0]) == kOps, "facts per CopyOp");

// Bytes per unit of WorkItem::n on each side.
int64_t src_size(CopyOp op) { return static_cast<int64_t>(c10::elementSize(kOpFacts[static_cast<int>(op)].src)); }
int64_t dst_size(CopyOp op) { return static_cast<int64_t>(c10::elementSize(kOpFacts[static_cast<int>(op)].dst)); }

bool op_for(at::ScalarType s, at::ScalarType d, CopyOp* op) {
  if (s == d) {
    // A quantized copy_ also copies the quantizer: not a byte copy. Stock's bool copy writes
    // canonical 0/1 bytes, where a byte copy would keep any other byte a bool tensor holds.
    if (at::isQIntType(s) || s == at::kBool) return false;
    *op = CopyOp::Memcpy;
    return true;
  }
  for (int k = 1; k < kOps; ++k) {
    if (kOpFacts[k].src == s && kOpFacts[k].dst == d) {
      *op = static_cast<CopyOp>(k);
      return true;
    }
  }
  return false;
}

// FBGEMM's Float16ToFloat (stock copy_ takes it for contiguous or equal-stride fp16->fp32 on CPU)
// converts blocks of 8 in hardware and the rest with a scalar routine that turns every NaN into
// 0x7fffffff; above GRAIN_SIZE elements it runs once per at::parallel_for chunk, so the scalar
// tails sit at the end of each chunk. Reproduce exactly those chunks.
// `threads`: the threads stock's copy_ would split over (CpuCopyBatch::caller_threads).
void add_fbgemm_chunks(std::vector<WorkItem>* items, char* dst, const char* src, int64_t n, int64_t threads) {
  const int64_t grain = at::internal::GRAIN_SIZE;
  int64_t chunks = 1;
  if (n > grain && threads > 1) {
    chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
  }
  const int64_t chunk = (n + chunks - 1) / chunks;
  for (int64_t b = 0; b < n; b += chunk) {
    const int64_t len = std::min(chunk, n - b);
    items->push_back({dst + 4 * b, src + 2 * b, len, len / 8 * 8, CopyOp::F16ToF32});
  }
}

bool fbgemm_layout(const at::Tensor& d, const at::Tensor& s) {
  return (d.is_contiguous() && s.is_contiguous()) ||
         (d.is_non_overlapping_and_dense() && d.strides() == s.strides());
}

void convert(const WorkItem& it, const OpConfig& cfg, int64_t a, int64_t b) {
  const ConvertFns& f = *cfg.fns;
  switch (it.op) {
    case CopyOp::F32ToBF16:
      f.f32_to_bf16(reinterpret_cast<const float*>(it.src) + a, reinterpret_cast<uint16_t*>(it.dst) + a, b - a);
      return;
    case CopyOp::BF16ToF32:
      f.bf16_to_f32(reinterpret_cast<const uint16_t*>(it.src) + a, reinterpret_cast<float*>(it.dst) + a, b - a);
      return;
    case CopyOp::F32ToF16:
      f.f32_to_f16(reinterpret_cast<const float*>(it.src) + a, reinterpret_cast<uint16_t*>(it.dst) + a, b - a);
      return;
    case CopyOp::F16ToF32: {
      const auto* src = reinterpret_cast<const uint16_t*>(it.src);
      auto* dst = reinterpret_cast<float*>(it.dst);
      f.f16_to_f32(src + a, dst + a, b - a);
      for (int64_t k = std::max(a, it.exact_len); k < b; ++k) {
        if ((src[k] & 0x7c00) == 0x7c00 && (src[k] & 0x03ff) != 0) {
          const uint32_t nan = 0x7fffffffu;
          std::memcpy(dst + k, &nan, sizeof(nan));
        }
      }
      return;
    }
    default:
      TORCH_INTERNAL_ASSERT(false);
  }
}

// Copies destination bytes [lo, hi) of one item (a byte copy with streaming stores where
// `stream`). Element bounds round up on both ends, so the threads' byte ranges split the
// elements without overlap or gap. Returns the bytes streamed.
int64_t copy_range(const WorkItem& it, const Config& cfg, int64_t lo, int64_t hi, bool stream) {
  if (it.op == CopyOp::Memcpy) {
    if (stream) {
      stream_copy(it.dst + lo, it.src + lo, hi - lo);
      return hi - lo;
    }
    for (int64_t a = lo; a < hi; a += kMemcpyChunk) {
      std::memcpy(it.dst + a, it.src + a, std::min(kMemcpyChunk, hi - a));
    }
    return 0;
  }
  const int64_t ds = dst_size(it.op);
  const int64_t a = (lo + ds - 1) / ds;
  const int64_t b = std::min(it.n, (hi + ds - 1) / ds);
  if (a < b) convert(it, cfg.ops[static_cast<int>(it.op)], a, b);
  return 0;
}

}  // namespace

int64_t CpuCopyBatch::caller_threads() {
  return at::in_parallel_region() ? 1 : at::get_num_threads();
}

CpuCopyBatch::CpuCopyBatch() : config_(published_config()), split_threads_(caller_threads()) {}

bool CpuCopyBatch::add_pair(const at::Tensor& dst, const at::Tensor& src) {
  CopyOp op;
  bool mergeable;
  // No 0-dim conversion gets here: the planner sends it to stock's loop (order_dependent).
  if (!dtype_op(src.scalar_type(), dst.scalar_type(), &op, &mergeable)) return false;
  // A conversion of FBGEMM's matches stock only on the layouts copy_ hands FBGEMM.
  if (config_->ops[static_cast<int>(op)].fbgemm_split && !fbgemm_layout(dst, src)) return false;
  const int64_t n = dst.numel();
  char* d = static_cast<char*>(dst.mutable_data_ptr());
  const char* s = static_cast<const char*>(src.const_data_ptr());
  if (!mergeable) {
    add_fbgemm_chunks(&items_, d, s, n, split_threads_);
  } else {
    add_contiguous(d, s, op == CopyOp::Memcpy ? n * static_cast<int64_t>(dst.element_size()) : n, op, false);
  }
  return true;
}

bool CpuCopyBatch::dtype_op(at::ScalarType src, at::ScalarType dst, CopyOp* op, bool* mergeable) const {
  if (!op_for(src, dst, op)) return false;
  if (*op == CopyOp::Memcpy) {
    *mergeable = true;
    return true;
  }
  const auto& cfg = config_->ops[static_cast<int>(*op)];
  if (cfg.fns == nullptr) return false;
  // FBGEMM's fp16->fp32 tails sit where each pair ends: such pairs are never merged.
  *mergeable = !(*op == CopyOp::F16ToF32 && cfg.fbgemm_split);
  return true;
}

const ConvertFns* iterator_f16_to_f32_fns() { return published_config()->iterator_f16_to_f32; }

std::vector<std::pair<at::ScalarType, at::ScalarType>> kernel_pairs() {
  std::vector<std::pair<at::ScalarType, at::ScalarType>> out;
  const CpuCopyBatch batch;
  const int n = static_cast<int>(at::ScalarType::NumOptions);
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      CopyOp op;
      bool mergeable;
      const auto st = static_cast<at::ScalarType>(s), dt = static_cast<at::ScalarType>(d);
      if (batch.dtype_op(st, dt, &op, &mergeable)) out.emplace_back(st, dt);
    }
  }
  return out;
}

const ConvertFns* CpuCopyBatch::fns(CopyOp op) const { return config_->ops[static_cast<int>(op)].fns; }

void CpuCopyBatch::add_fbgemm_f16_to_f32(char* dst, const char* src, int64_t numel) {
  add_fbgemm_chunks(&items_, dst, src, numel, split_threads_);
}

bool CpuCopyBatch::add_run(at::TensorList dsts, at::TensorList srcs, const int64_t* members,
                           int64_t count, int64_t numel) {
  const auto& d0 = dsts[members[0]];
  const auto& s0 = srcs[members[0]];
  CopyOp op;
  bool mergeable;
  if (!dtype_op(s0.scalar_type(), d0.scalar_type(), &op, &mergeable)) return false;
  if (!mergeable) {
    // Stock copies pair by pair, each with its own scalar tail.
    for (int64_t k = 0; k < count; ++k) {
      add_fbgemm_chunks(&items_, static_cast<char*>(dsts[members[k]].mutable_data_ptr()),
                        static_cast<const char*>(srcs[members[k]].const_data_ptr()),
                        dsts[members[k]].numel(), split_threads_);
    }
    return true;
  }
  char* d = static_cast<char*>(d0.mutable_data_ptr());
  const char* s = static_cast<const char*>(s0.const_data_ptr());
  add_contiguous(d, s, op == CopyOp::Memcpy ? numel * static_cast<int64_t>(d0.element_size()) : numel, op, false);
  return true;
}

void CpuCopyBatch::finish() {
  ends_.resize(items_.size());
  int64_t total = 0, moved = 0;
  for (size_t k = 0; k < items_.size(); ++k) {
    total += items_[k].n * dst_size(items_[k].op);
    moved += items_[k].n * src_size(items_[k].op);
    ends_[k] = total;
  }
  total_ = total;
  moved_ = moved + total;
}

bool CpuCopyBatch::alternate() {
  static thread_local bool backward = false;
  backward = !backward;
  return backward;
}

int64_t CpuCopyBatch::copy_bytes(int64_t begin, int64_t end, bool backward, bool stream) const {
  if (begin >= end) return 0;
  const Config& cfg = *config_;
  // Items [first, last) hold the range: the first ending after `begin` up to the first ending at
  // or after `end`.
  const size_t first = std::upper_bound(ends_.begin(), ends_.end(), begin) - ends_.begin();
  const size_t last = std::min<size_t>(
      items_.size(), std::lower_bound(ends_.begin() + first, ends_.end(), end) - ends_.begin() + 1);
  int64_t streamed = 0;
  auto one = [&](size_t k) {
    const int64_t start = k == 0 ? 0 : ends_[k - 1];
    streamed += copy_range(items_[k], cfg, std::max(begin, start) - start, std::min(end, ends_[k]) - start, stream);
  };
  if (backward) {
    for (size_t k = last; k > first; --k) one(k - 1);
  } else {
    for (size_t k = first; k < last; ++k) one(k);
  }
  return streamed;
}

void CpuCopyBatch::run(int64_t serial_moved_bytes) {
  if (items_.empty()) return;
  finish();
  byte_pass(total_, 1, moved_, static_cast<int64_t>(items_.size()), /*can_stream=*/true,
            [this](int64_t b, int64_t e, bool stream) { return copy_bytes(b, e, alternate(), stream); },
            serial_moved_bytes);
  items_.clear();
}

// ---------------------------------------------------------------------------------------------
// Self-check: stock copy_ against the kernel, on the values where implementations part ways
// (NaN payloads, signalling NaNs, -0.0, subnormals, infinities, rounding ties) at every position
// of every short length, and on every 16-bit pattern in one tensor long enough to be chunked.

namespace {

uint32_t lcg(uint64_t* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return static_cast<uint32_t>(*state >> 32);
}

std::vector<uint32_t> f32_specials() {
  std::vector<uint32_t> v = {
      0x7fc00000, 0xffc00000, 0xffc12345, 0x7f800001, 0xff800001, 0x7fa00000, 0x7fbfffff,
      0x7fffffff, 0xffffffff, 0x7f800000, 0xff800000, 0x00000000, 0x80000000, 0x00000001,
      0x80000001, 0x007fffff, 0x807fffff, 0x00400000, 0x3f800000, 0x3f808000, 0x3f818000,
      0x3f807fff, 0x3f80ffff, 0x7f7fffff, 0xff7fffff, 0x477fefff, 0x477ff000, 0x477fffff,
      0x33000000, 0x33000001, 0x33800000, 0x387fc000, 0x38800000, 0x38ffe000, 0xc7800000,
  };
  uint64_t st = 12345;
  for (int k = 0; k < 93; ++k) v.push_back(lcg(&st));
  return v;
}

std::vector<uint16_t> f16ish_specials() {
  std::vector<uint16_t> v = {0x7c01, 0xfc01, 0x7d01, 0xfd01, 0x7e00, 0xfe00, 0x7fff, 0xffff,
                             0x7c00, 0xfc00, 0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff,
                             0x7f81, 0xff81, 0x7fc1, 0x7f80, 0xff80, 0x0080, 0x3c00, 0x7bff};
  uint64_t st = 777;
  for (int k = 0; k < 40; ++k) v.push_back(static_cast<uint16_t>(lcg(&st)));
  return v;
}


// A tensor of `n` elements of `sdt` (2 or 4 bytes) whose bit patterns are pattern(k).
template <typename Bits, typename Pattern>
at::Tensor bits_tensor(int64_t n, at::ScalarType sdt, const Pattern& pattern) {
  auto t = at::empty({n}, at::TensorOptions().device(at::kCPU).dtype(sizeof(Bits) == 4 ? at::kInt : at::kShort));
  auto* p = static_cast<Bits*>(t.mutable_data_ptr());
  for (int64_t k = 0; k < n; ++k) p[k] = static_cast<Bits>(pattern(k));
  return t.view(sdt);
}

// Every length 1..72 of the specials `pat`, at `shifts` shifts.
template <typename Bits>
void add_short_sources(std::vector<at::Tensor>* srcs, at::ScalarType sdt, const std::vector<Bits>& pat, int64_t step,
                       int64_t shifts, int64_t shift_step) {
  for (int64_t len = 1; len <= 72; ++len) {
    for (int64_t shift = 0; shift < shifts; ++shift) {
      srcs->push_back(bits_tensor<Bits>(
          len, sdt, [&](int64_t k) { return pat[(k * step + len + shift * shift_step) % pat.size()]; }));
    }
  }
}

// Every 16-bit pattern, cycling.
at::Tensor all_half_patterns(int64_t n, at::ScalarType sdt) {
  return bits_tensor<uint16_t>(n, sdt, [](int64_t k) { return k * 40503u; });
}

bool matches_stock(CopyOp op, const Config& trial) {
  const auto sdt = kOpFacts[static_cast<int>(op)].src;
  const auto ddt = kOpFacts[static_cast<int>(op)].dst;
  const auto opts = at::TensorOptions().device(at::kCPU);
  // Past GRAIN_SIZE twice: stock's copy_ splits it into chunks.
  const int64_t big = 2 * at::internal::GRAIN_SIZE + 37;
  std::vector<at::Tensor> srcs;
  if (sdt == at::kFloat) {
    const auto pat = f32_specials();
    add_short_sources<uint32_t>(&srcs, sdt, pat, 7, 3, 11);
    srcs.push_back(bits_tensor<uint32_t>(big, sdt, [&](int64_t k) { return pat[k % pat.size()]; }));
  } else {
    add_short_sources<uint16_t>(&srcs, sdt, f16ish_specials(), 5, 3, 13);
    for (const int64_t n : {int64_t{65536}, big}) srcs.push_back(all_half_patterns(n, sdt));
  }
  // Each destination starts at another element of a 64-byte line (a variant may store whole
  // lines from the first boundary on): offsets cycle through every position as the sources go.
  const int64_t line = 64 / static_cast<int64_t>(c10::elementSize(ddt));
  int64_t k = 0;
  for (const auto& s : srcs) {
    auto want = at::empty(s.sizes(), opts.dtype(ddt));
    want.copy_(s);
    const int64_t off = (k++ * 7) % line;
    auto got = at::empty({s.numel() + off}, opts.dtype(ddt)).narrow(0, off, s.numel());
    CpuCopyBatch batch(&trial);
    if (!batch.add_pair(got, s)) return false;
    batch.run();
    if (std::memcmp(want.const_data_ptr(), got.const_data_ptr(), want.nbytes()) != 0) return false;
  }
  return true;
}

// Whether `f` widens fp16 to fp32 as stock's copy_ into rows of a wider buffer does (ATen's copy
// kernel, as cat's cast runs it; copy_'s FBGEMM path needs a contiguous destination): every fp16
// value, in vector bodies and tails.
bool matches_iterator_f16_to_f32(const ConvertFns& f) {
  const auto opts = at::TensorOptions().device(at::kCPU);
  std::vector<at::Tensor> srcs;
  add_short_sources<uint16_t>(&srcs, at::kHalf, f16ish_specials(), 5, 1, 0);
  srcs.push_back(all_half_patterns(65536 + 37, at::kHalf));
  for (const auto& s : srcs) {
    const int64_t n = s.numel();
    auto want = at::empty({2, n + 3}, opts.dtype(at::kFloat)).narrow(1, 0, n);
    want.copy_(at::stack({s, s}));
    auto got = at::empty({n}, opts.dtype(at::kFloat));
    f.f16_to_f32(static_cast<const uint16_t*>(s.const_data_ptr()), static_cast<float*>(got.mutable_data_ptr()), n);
    for (int64_t r = 0; r < 2; ++r) {
      if (std::memcmp(want.select(0, r).contiguous().const_data_ptr(), got.const_data_ptr(), got.nbytes()) != 0) {
        return false;
      }
    }
  }
  return true;
}

const ConvertFns* capability_fns() {
  const std::string cap = at::get_cpu_capability();
  if (cap == "AVX512") return convert_fns_avx512();
  if (cap == "AVX2") return convert_fns_avx2();
  if (cap == "DEFAULT") return convert_fns_default();
  return nullptr;
}

const ConvertFns* hardware_f16c_fns() {
  if (const auto* f = convert_fns_avx512()) return f;
  return convert_fns_avx2();
}

bool has_fbgemm() {
  for (const auto e : at::globalContext().supportedQEngines()) {
    if (e == at::QEngine::FBGEMM) return true;
  }
  return false;
}

const char* variant_name(const ConvertFns* f) { return f == nullptr ? "none" : f->name; }

}  // namespace

std::vector<ConversionCheck> self_check() {
  static std::mutex m;
  std::lock_guard<std::mutex> g(m);
  // Stock must be stock: no Python mode may see (or redirect) the reference copies.
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  stream_moved_bytes();  // its sysfs reads happen here, at load, not inside a copy's region
  auto* cfg = new Config();  // published for the process lifetime; never freed
  const ConvertFns* cap = capability_fns();
  std::vector<OpConfig> f16_candidates;
  if (has_fbgemm()) {
    if (const auto* hw = hardware_f16c_fns()) f16_candidates.push_back({hw, true});
  }
  if (cap != nullptr) f16_candidates.push_back({cap, false});
  if (!has_fbgemm()) {
    if (const auto* hw = hardware_f16c_fns()) f16_candidates.push_back({hw, true});
  }
  for (int k = 1; k < kOps; ++k) {
    const auto op = static_cast<CopyOp>(k);
    std::vector<OpConfig> candidates;
    if (op == CopyOp::F32ToF16 || op == CopyOp::F16ToF32) {
      candidates = f16_candidates;
    } else if (cap != nullptr) {
      candidates.push_back({cap, false});
    }
    for (const auto& c : candidates) {
      Config trial = *cfg;
      trial.ops[k] = c;
      if (matches_stock(op, trial)) {
        cfg->ops[k] = c;
        break;
      }
    }
  }
  for (const ConvertFns* f : {capability_fns(), hardware_f16c_fns()}) {
    if (f != nullptr && matches_iterator_f16_to_f32(*f)) {
      cfg->iterator_f16_to_f32 = f;
      break;
    }
  }
  g_config.store(cfg, std::memory_order_release);
  // Memcpy is left out: a byte copy is what stock does for one dtype.
  std::vector<ConversionCheck> out;
  for (int k = 1; k < kOps; ++k) {
    out.push_back({kOpFacts[k].name, cfg->ops[k].fns != nullptr, variant_name(cfg->ops[k].fns),
                   cfg->ops[k].fbgemm_split});
  }
  return out;
}

}  // namespace npu_dispatch
