#include "mode_route.h"

#include <ATen/core/PythonFallbackKernel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/SafePyObject.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "capability_table.h"
#include "fast_lane.h"
#include "lane_call.h"
#include "native_stats.h"

namespace npu_dispatch {
namespace {

struct RouteMode {
  PyObject* mode = nullptr;
  int64_t depth = 0;
  bool probe = false;  // a benchmark's floor: take the call and do nothing
  std::optional<std::pair<at::Tensor, at::Tensor>> probe_copy;  // (dst, src): copied instead
  OpStats stats;
};

std::mutex g_mutex;
std::vector<std::shared_ptr<RouteMode>> g_modes;  // entered ones
std::atomic<int64_t> g_entered{0};
std::atomic<int64_t> g_route_calls{0};

std::shared_ptr<RouteMode> find_locked(PyObject* mode) {
  for (const auto& m : g_modes) {
    if (m->mode == mode) return m;
  }
  return nullptr;
}

// The one dispatch mode on this thread's stack (user or infra), if it is an entered
// NpuFastCopyMode. A mode stack copied to another thread (autograd's workers, at::launch)
// carries the same object, so the route serves those threads too.
std::shared_ptr<RouteMode> sole_route_mode() {
  if (g_entered.load(std::memory_order_relaxed) == 0 || c10::impl::TorchDispatchModeTLS::stack_len() != 1) {
    return nullptr;
  }
  const auto& top = c10::impl::TorchDispatchModeTLS::get_stack_at(0);
  PyObject* obj = top->ptr(&top->pyinterpreter());
  std::lock_guard<std::mutex> g(g_mutex);
  return find_locked(obj);
}

// VariableType's _foreach_copy_ acts on forward-mode tangents (level 0); levels exist only as a
// stack from 0, so none at 0 means no tensor has one.
bool forward_ad_active() { return torch::autograd::ForwardADLevel::try_get_by_idx(0) != nullptr; }

// Up to this many bytes read plus written the route copies on the calling thread (the direct
// entry splits above 256 KB). A routed call spends ~100 us on one thread in the binding around
// its copy, the worker idles meanwhile, and its half of the bytes lands in the other core's
// caches: on the 2-core AMD EPYC host of 2026-12-02, tiny_many under the mode (512 pairs,
// 327 KB written, 654 KB moved) took 163 to 176 us copied on one thread against 284 to 289 us
// split (three pairs of alternating processes), and with a busy second core the split pass
// waited milliseconds for the worker (docs/profile.md, "The route copies small calls on one
// thread"). adjacent (one coalesced run, 914 KB moved) read 5 to 10 % slower on one thread, so
// it and larger calls keep the split.
constexpr int64_t kRouteSerialMovedBytes = 768 * 1024;

// One pair through the fast lane (a probe's bytes), copied as the route copies; false where
// the lane refuses it.
bool probe_copy(const std::pair<at::Tensor, at::Tensor>& pair) {
  const auto caps = current_capabilities();  // the lane keeps pointers into it
  FastLane lane;
  if (!lane.prepare(at::TensorList(&pair.first, 1), at::TensorList(&pair.second, 1), *caps)) {
    return false;
  }
  lane.run(kRouteSerialMovedBytes);
  return true;
}

bool route_lane(at::TensorList self, at::TensorList src) {
  const size_t n = self.size();
  bool bumps = true;
  if (n == 0 || n != src.size() || !lane_keys_plain(/*under_mode=*/true, &bumps)) return false;
  const auto mode = sole_route_mode();
  if (mode == nullptr || forward_ad_active()) return false;
  if (mode->probe) {
    // A pair the lane took on entry and refuses now (resized meanwhile): say so rather than
    // time a floor that copied nothing.
    TORCH_CHECK(!mode->probe_copy || probe_copy(*mode->probe_copy),
                "probe copy: the fast lane refuses the pair it took on entry");
    return true;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto caps = current_capabilities();  // the lane keeps pointers into it
  LaneCall call(n);
  c10::TensorImpl** impls = call.impls();
  for (size_t i = 0; i < n; ++i) {
    impls[i] = self[i].unsafeGetTensorImpl();
    impls[n + i] = src[i].unsafeGetTensorImpl();
  }
  // The caller's lists own the tensors for the whole call, and no GIL is held here. One
  // thread checks every pair: after the call the binding drops its reference to each tensor,
  // and the lines the sharded lane's other thread had read come back from that core first;
  // measured, sharding gained nothing here (docs/profile.md, "The mode's dispatch route").
  switch (call.prepare(*caps, c10::GradMode::is_enabled(), kReleaseGilBytes, /*shard=*/false, bumps,
                       kRouteSerialMovedBytes)) {
    case LaneCall::Step::Refused:
      return false;
    case LaneCall::Step::Prepared:
      call.copy();
      break;
    case LaneCall::Step::Copied:
      break;
  }
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
  mode->stats.record(kOpAtenForeachCopy, call.counts(), ns.count());
  g_route_calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// What PythonTLSSnapshot's fallback (ATen/core/PythonFallbackKernel.cpp) does, unboxed.
void route_foreach_copy(c10::DispatchKeySet ks, at::TensorList self, at::TensorList src, bool non_blocking) {
  if (route_lane(self, src)) return;
  at::impl::MaybeSetTLSOnEntryGuard guard;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("aten::_foreach_copy_", "")
                             .typed<void(at::TensorList, at::TensorList, bool)>();
  op.redispatch(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::PythonTLSSnapshot), self,
                src, non_blocking);
}

}  // namespace

void install_mode_route() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: the registration lasts the process.
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PythonTLSSnapshot, __FILE__,
                                   __LINE__);
    lib->impl("_foreach_copy_", TORCH_FN(route_foreach_copy));
  });
}

void route_mode_entered(PyObject* mode, bool probe,
                        const std::optional<std::pair<at::Tensor, at::Tensor>>& probe_copy_pair) {
  if (probe_copy_pair && !probe_copy(*probe_copy_pair)) {
    throw std::invalid_argument(
        "probe copy: the fast lane refuses this pair (it takes contiguous CPU tensors of one shape, of a dtype "
        "pair it copies exactly, not overlapping)");
  }
  std::lock_guard<std::mutex> g(g_mutex);
  auto m = find_locked(mode);
  if (m == nullptr) {
    m = std::make_shared<RouteMode>();
    m->mode = mode;
    m->probe = probe;
    m->probe_copy = probe_copy_pair;
    Py_INCREF(mode);  // its address stays its own while the route may match it
    g_modes.push_back(m);
    g_entered.fetch_add(1, std::memory_order_relaxed);
  }
  ++m->depth;
}

std::vector<int64_t> route_mode_exited(PyObject* mode) {
  std::shared_ptr<RouteMode> m;
  bool last = false;
  {
    std::lock_guard<std::mutex> g(g_mutex);
    m = find_locked(mode);
    if (m == nullptr) return {};
    last = --m->depth == 0;
    if (last) {
      g_modes.erase(std::find(g_modes.begin(), g_modes.end(), m));
      g_entered.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  // A copy another thread's route is finishing for this mode right now is not counted.
  auto counts = m->stats.drain();
  if (last) Py_DECREF(mode);  // outside the lock: the caller still holds the object anyway
  return counts;
}

std::vector<int64_t> drain_route_mode(PyObject* mode) {
  std::shared_ptr<RouteMode> m;
  {
    std::lock_guard<std::mutex> g(g_mutex);
    m = find_locked(mode);
  }
  return m == nullptr ? std::vector<int64_t>() : m->stats.drain();
}

int64_t mode_route_calls() { return g_route_calls.load(std::memory_order_relaxed); }

}  // namespace npu_dispatch
