#include "dispatch/intercept.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "planner/copy_call.h"
#include "planner/execute.h"
#include "fsdp/copies.h"
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include "dispatch/mode_scope.h"
#include "planner/plan.h"
#include "planner/spans.h"

namespace npu_dispatch {
namespace {

const c10::DispatchKeySet kAfterBackendSelect(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);

// The owned op's handle, typed on its row's schema.
template <typename Fn>
c10::TypedOperatorHandle<Fn> handle(CountedOp op) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(std::string(kOwnedOps[op].name()).c_str(),
                                                         std::string(kOwnedOps[op].overload()).c_str())
      .typed<Fn>();
}

// A call this kernel counts, handed on to the op's own kernel: any owned op that kernel calls
// (FSDP's copy-out calls aten's) passes the interception by, so the call is counted once.
template <typename Fn, typename... Args>
auto to_stock(const c10::TypedOperatorHandle<Fn>& op, c10::DispatchKeySet ks, Args&&... args) {
  StockCall counted_here;
  return op.redispatch(ks & kAfterBackendSelect, std::forward<Args>(args)...);
}

// The one question every interception kernel asks: the scope to serve this call in, or nullptr
// when the call goes on below unchanged (no mode entered, the planner's own stock call, or
// tensors of a FakeTensor's execution, which are meta).
ModeScope* serving(const at::Tensor* first) {
  ModeScope* s = active_scope();
  if (s == nullptr || inside_planner() || (first != nullptr && first->is_meta())) return nullptr;
  return s;
}

// Each interception kernel is a template on its row (dispatch/owned_ops.h): the op it redispatches
// and counts. A row whose op takes the same arguments as another's names the same kernel.

template <CountedOp kOp>
void foreach_copy_(c10::DispatchKeySet ks, at::TensorList self, at::TensorList src, bool non_blocking) {
  ModeScope* s = serving(self.empty() ? nullptr : &self[0]);
  if (s == nullptr) {
    static const auto op = handle<void(at::TensorList, at::TensorList, bool)>(kOp);
    op.redispatch(ks & kAfterBackendSelect, self, src, non_blocking);
    return;
  }
  const int64_t t0 = now_ns();
  const auto counts = plan_and_run(self, src, non_blocking, false);
  s->stats->record(kOp, counts, now_ns() - t0);
}

template <CountedOp kOp>
std::vector<at::Tensor> foreach_copy(c10::DispatchKeySet ks, at::TensorList self, at::TensorList src,
                                     bool non_blocking) {
  ModeScope* s = serving(self.empty() ? nullptr : &self[0]);
  if (s == nullptr) {
    static const auto op = handle<std::vector<at::Tensor>(at::TensorList, at::TensorList, bool)>(kOp);
    return op.redispatch(ks & kAfterBackendSelect, self, src, non_blocking);
  }
  const int64_t t0 = now_ns();
  check_lists(self, src);  // before allocating, as stock
  std::vector<at::Tensor> outs;
  outs.reserve(self.size());
  for (const auto& d : self) outs.push_back(functional_output(d));
  const auto counts = plan_and_run(outs, src, non_blocking, false, /*bump=*/false);
  s->stats->record(kOp, counts, now_ns() - t0);
  return outs;
}

using CopyInFn = std::tuple<at::Tensor, at::Tensor>(at::TensorList, const at::Tensor&, c10::SymIntArrayRef,
                                                    c10::SymInt, c10::SymInt);

template <CountedOp kOp>
std::tuple<at::Tensor, at::Tensor> fsdp_all_gather_copy_in(c10::DispatchKeySet ks, at::TensorList inputs,
                                                           const at::Tensor& out, c10::SymIntArrayRef sizes,
                                                           c10::SymInt numel, c10::SymInt rank) {
  ModeScope* s = serving(&out);
  const auto concrete_sizes = c10::asIntArrayRefSlowOpt(sizes);
  const auto concrete_numel = numel.maybe_as_int();
  const auto concrete_rank = rank.maybe_as_int();
  if (s == nullptr || !concrete_sizes || !concrete_numel || !concrete_rank) {
    // Symbolic sizes (real tensors only reach here outside a trace): FSDP's kernel runs, its
    // _foreach_copy_ served and counted as aten's.
    static const auto op = handle<CopyInFn>(kOp);
    return op.redispatch(ks & kAfterBackendSelect, inputs, out, sizes, std::move(numel), std::move(rank));
  }
  const int64_t t0 = now_ns();
  CallResult counts;
  auto result = all_gather_copy_in(inputs, out, *concrete_sizes, *concrete_numel, *concrete_rank, false,
                                   std::nullopt, &counts);
  s->stats->record(kOp, counts, now_ns() - t0);
  return result;
}

using SplitCopyFn = void(const at::Tensor&, c10::SymIntArrayRef, int64_t, at::TensorList);

// The all-gather copy-out (fsdp/copies.h), for FSDP2's op and for aten's out= op it calls; refused
// calls go on to the op's kernel unchanged.
template <CountedOp kOp>
void copy_out_kernel(c10::DispatchKeySet ks, const at::Tensor& src, c10::SymIntArrayRef sizes, int64_t dim,
                     at::TensorList out) {
  ModeScope* s = serving(&src);
  const auto concrete = c10::asIntArrayRefSlowOpt(sizes);
  static const auto op =
      handle<SplitCopyFn>(kOp);
  if (s == nullptr || !concrete) {
    op.redispatch(ks & kAfterBackendSelect, src, sizes, dim, out);
    return;
  }
  const int64_t t0 = now_ns();
  Kind why = Kind::MayRaise;
  auto counts = copy_out(src, *concrete, dim, out, false, bumps_here(), &why);
  if (!counts) {
    to_stock(op, ks, src, sizes, dim, out);
    counts = stock_counts(why, static_cast<int64_t>(out.size()), total_bytes(out));
  }
  s->stats->record(kOp, *counts, now_ns() - t0);
}

// The reduce-scatter copy-in kernels' shared body: `serve` is the op's fsdp/copies.h entry, and a
// call it refuses goes on to the op's own kernel unchanged.
template <typename Fn, typename Out, typename Serve>
void serve_chunk_cat(const c10::TypedOperatorHandle<Fn>& op, CountedOp counted, c10::DispatchKeySet ks,
                     at::TensorList tensors, int64_t dim, int64_t num_chunks, Out& out, Serve serve) {
  ModeScope* s = serving(&out);
  if (s == nullptr) {
    op.redispatch(ks & kAfterBackendSelect, tensors, dim, num_chunks, out);
    return;
  }
  const int64_t t0 = now_ns();
  Kind why = Kind::MayRaise;
  auto counts = serve(&why);
  if (!counts) {
    to_stock(op, ks, tensors, dim, num_chunks, out);
    counts = stock_counts(why, static_cast<int64_t>(tensors.size()), total_bytes({out}));
  }
  s->stats->record(counted, *counts, now_ns() - t0);
}

using ChunkCatFn = void(at::TensorList, int64_t, int64_t, const at::Tensor&);

// FSDP2's reduce-scatter copy-in (fsdp/copies.h).
template <CountedOp kOp>
void fsdp_chunk_cat(c10::DispatchKeySet ks, at::TensorList tensors, int64_t dim, int64_t num_chunks,
                    const at::Tensor& out) {
  static const auto op = handle<ChunkCatFn>(kOp);
  serve_chunk_cat(op, kOp, ks, tensors, dim, num_chunks, out, [&](Kind* why) {
    return chunk_cat(tensors, dim, num_chunks, out, false, bumps_here(), why);
  });
}

// (A C++ op: its kernels take out as Tensor&, and every kernel's signature must match.)
using ChunkCatMixedFn = void(at::TensorList, int64_t, int64_t, at::Tensor&);

// torch 2.15's FSDP2 reduce-scatter copy-in (fsdp/copies.h).
template <CountedOp kOp>
void fsdp_chunk_cat_mixed(c10::DispatchKeySet ks, at::TensorList tensors, int64_t dim, int64_t num_chunks,
                                at::Tensor& out) {
  static const auto op =
      handle<ChunkCatMixedFn>(kOp);
  serve_chunk_cat(op, kOp, ks, tensors, dim, num_chunks, out, [&](Kind* why) {
    return chunk_cat_mixed(tensors, dim, num_chunks, out, false, bumps_here(), why);
  });
}

void passthrough(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  std::optional<StockCall> counted_here;  // as to_stock, for a call counted here
  if (ModeScope* s = serving(nullptr)) {
    const auto& name = op.operator_name();
    const auto row = owned_op(name.overload_name.empty() ? name.name : name.name + "." + name.overload_name);
    s->stats->record(*row, whole_call_counts(op, *stack, Kind::Schema), 0);
    counted_here.emplace();
  }
  op.redispatchBoxed(ks & kAfterBackendSelect, stack);
}

// The in-reach marker (dispatch/intercept.h): what a call of a marked op found at ADInplaceOrView.
thread_local int64_t t_in_reach_modes = -1;

void in_reach_marker(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  struct Restore {
    int64_t saved = t_in_reach_modes;
    ~Restore() { t_in_reach_modes = saved; }
  } restore;
  t_in_reach_modes = c10::impl::TorchDispatchModeTLS::stack_len();
  // The keyset after ADInplaceOrView, as the fallthrough there would pass it on; TLS untouched.
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::ADInplaceOrView),
                     stack);
}

// Never destroyed: the registrations last the process.
torch::Library* library(const std::string& ns) {
  return new torch::Library(torch::Library::IMPL, ns, c10::DispatchKey::BackendSelect, __FILE__, __LINE__);
}

}  // namespace

namespace {
// A tensor's bytes: none for an undefined tensor, one with symbolic sizes, or a tensor subclass
// (fake tensors included: asking a subclass its sizes may call into Python).
int64_t real_bytes(const at::Tensor& t) {
  if (!t.defined() || t.key_set().has(c10::DispatchKey::Python)) return 0;
  return t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ? 0 : tensor_bytes(t);
}
}  // namespace

CallResult whole_call_counts(const c10::OperatorHandle& op, const torch::jit::Stack& stack, Kind why) {
  const auto& args = op.schema().arguments();
  const size_t base = stack.size() - args.size();
  int64_t pairs = -1, bytes = 0, first_bytes = 0;
  bool writes = false;
  for (size_t k = 0; k < args.size(); ++k) {
    const auto& v = stack[base + k];
    int64_t b = 0;
    if (v.isTensor()) {
      b = real_bytes(v.toTensor());
    } else if (v.isTensorList()) {
      for (const c10::IValue& t : v.toListRef()) b += real_bytes(t.toTensor());
      if (pairs < 0) {
        pairs = static_cast<int64_t>(v.toListRef().size());
        first_bytes = b;
      }
    }
    if (args[k].alias_info() != nullptr && args[k].alias_info()->isWrite()) {
      writes = true;
      bytes += b;
    }
  }
  return stock_counts(why, pairs < 0 ? 1 : pairs, writes ? bytes : first_bytes, /*bumped=*/false);
}

void install_interception(const std::vector<std::string>& served) {
  static std::mutex m;
  static std::set<int> done;
  std::lock_guard<std::mutex> g(m);
  for (const auto& name : served) {
    const auto row = owned_op(name);
    TORCH_CHECK(row && kOwnedOps[*row].intercepted, "npu_dispatch: not an intercepted op (dispatch/owned_ops.h): ", name);
  }
  for (int k = 0; k < kNumCountedOps; ++k) {
    const OwnedOp& row = kOwnedOps[k];
    const bool wanted = row.intercepted && (row.ns() == "aten" ||
                                            std::find(served.begin(), served.end(), row.qualified()) != served.end());
    if (!wanted || !done.insert(k).second) continue;
    auto* lib = library(std::string(row.ns()));
    const std::string name(row.impl_name());
    switch (static_cast<CountedOp>(k)) {
#define NPU_DISPATCH_STOCK_OP(id, kernel, wrapper, copy, schema) \
  case kOp##id:                                            \
    lib->impl(name.c_str(), TORCH_FN(kernel<kOp##id>));    \
    break;
#define NPU_DISPATCH_LIBRARY_OP(id, kernel, wrapper, copy, schema)
#include "dispatch/owned_ops.h"
#undef NPU_DISPATCH_STOCK_OP
#undef NPU_DISPATCH_LIBRARY_OP
      default:
        break;
    }
  }
}

bool install_in_reach_marker(const std::string& qualified) {
  static std::mutex m;
  static std::map<std::string, bool> done;
  std::lock_guard<std::mutex> g(m);
  auto it = done.find(qualified);
  if (it != done.end()) return it->second;
  const auto pos = qualified.find("::");
  const auto [name, overload] = split_qualified(qualified);
  const auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName(std::string(name), std::string(overload)));
  const bool ok = pos != std::string::npos && op && !op->hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView);
  if (ok) {
    auto* lib = new torch::Library(torch::Library::IMPL, qualified.substr(0, pos), c10::DispatchKey::ADInplaceOrView,
                                   __FILE__, __LINE__);
    lib->impl(qualified.substr(pos + 2).c_str(), torch::CppFunction::makeFromBoxedFunction<&in_reach_marker>());
  }
  done[qualified] = ok;
  return ok;
}

int64_t in_reach_modes() { return t_in_reach_modes; }

void install_passthrough(const std::string& qualified) {
  static std::mutex m;
  static std::set<std::string> done;
  std::lock_guard<std::mutex> g(m);
  if (!done.insert(qualified).second) return;
  const auto row = owned_op(qualified);
  TORCH_CHECK(row && kOwnedOps[*row].intercepted, "npu_dispatch: not an owned op (dispatch/owned_ops.h): ", qualified);
  auto* lib = new torch::Library(torch::Library::IMPL, std::string(kOwnedOps[*row].ns()), c10::DispatchKey::BackendSelect,
                                 __FILE__, __LINE__);
  lib->impl(std::string(kOwnedOps[*row].impl_name()).c_str(), torch::CppFunction::makeFromBoxedFunction<&passthrough>());
}

}  // namespace npu_dispatch
