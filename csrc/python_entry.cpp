// The engine's per-call entry from Python. A torch.ops call boxes every tensor into an IValue
// and unboxes it into a fresh std::vector (a refcount bump, and a GIL round trip, per tensor);
// here the lists are read straight from the Python objects and the tensors only borrowed.
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <vector>

#include "borrowed.h"
#include "capability_table.h"
#include "copy_call.h"
#include "lane_call.h"
#include "mode_route.h"
#include "native_stats.h"

namespace {

// Strong references to the list items for the whole call: another thread may mutate the lists
// while the GIL is released.
class PyRefs {
 public:
  ~PyRefs() {
    for (PyObject* o : objs_) Py_DECREF(o);
  }
  void add(PyObject* o) {
    Py_INCREF(o);
    objs_.push_back(o);
  }
  void reserve(size_t n) { objs_.reserve(n); }

 private:
  std::vector<PyObject*> objs_;
};

bool unpack(PyObject* seq, const char* name, PyRefs* refs, npu_dispatch::BorrowedTensors* out) {
  PyObject* fast = PySequence_Fast(seq, "expected a list or tuple of Tensors");
  if (fast == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  refs->reserve(2 * n);
  out->reserve(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!THPVariable_Check(items[i])) {
      PyErr_Format(PyExc_TypeError, "%s[%zd] is a %s, not a Tensor", name, i, Py_TYPE(items[i])->tp_name);
      Py_DECREF(fast);
      return false;
    }
    refs->add(items[i]);
    out->push_back(THPVariable_Unpack(items[i]));
  }
  Py_DECREF(fast);
  return true;
}

PyObject* to_tuple(const std::vector<int64_t>& v) {
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(v.size()));
  if (out == nullptr) return nullptr;
  for (size_t k = 0; k < v.size(); ++k) {
    PyObject* item = PyLong_FromLongLong(v[k]);
    if (item == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(k), item);
  }
  return out;
}

// foreach_copy_planned(dsts, srcs, non_blocking, strict, bump[, defer_if_grad])
//   -> tuple of ints (execute.h)
PyObject* foreach_copy_planned(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 5 && nargs != 6) {
    PyErr_SetString(PyExc_TypeError,
                    "foreach_copy_planned(dsts, srcs, non_blocking, strict, bump[, defer_if_grad])");
    return nullptr;
  }
  PyRefs refs;
  npu_dispatch::BorrowedTensors dsts, srcs;
  if (!unpack(args[0], "dst", &refs, &dsts) || !unpack(args[1], "src", &refs, &srcs)) {
    return nullptr;
  }
  const bool non_blocking = PyObject_IsTrue(args[2]) == 1;
  const bool strict = PyObject_IsTrue(args[3]) == 1;
  const bool bump = PyObject_IsTrue(args[4]) == 1;
  const bool defer_if_grad = nargs == 6 && PyObject_IsTrue(args[5]) == 1;
  std::vector<int64_t> counts;
  {
    pybind11::gil_scoped_release no_gil;
    counts = npu_dispatch::plan_and_run(dsts, srcs, non_blocking, strict, bump, defer_if_grad);
  }
  return to_tuple(counts);
  END_HANDLE_TH_ERRORS
}

// Nothing between the caller and the kernel would act on the op: no dispatch mode (or, for
// `from_mode`, exactly one: NpuFastCopyMode, whose torch-function front checked that it is the
// one), no torch function mode, and the thread's dispatch keys as lane_keys_plain() wants them.
bool plain_context(bool from_mode) {
  return c10::impl::TorchDispatchModeTLS::stack_len() == (from_mode ? 1 : 0) &&
         !at::impl::torch_function_mode_enabled() && npu_dispatch::lane_keys_plain(from_mode);
}

// An exact list or tuple (FSDP2 passes torch.split's tuples): its items and length, no copy.
bool seq_items(PyObject* seq, PyObject*** items, Py_ssize_t* n) {
  if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) return false;
  *items = PySequence_Fast_ITEMS(seq);
  *n = PySequence_Fast_GET_SIZE(seq);
  return true;
}

bool unpack_impls(PyObject* list, c10::TensorImpl** out) {
  PyObject** items;
  Py_ssize_t n;
  if (!seq_items(list, &items, &n)) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = items[i];
    if (!THPVariable_CheckExact(o)) return false;
    out[i] = THPVariable_Unpack(o).unsafeGetTensorImpl();
  }
  return true;
}

// The direct op's answer once the copy and its bumps are done: the count vector for the mode's
// front, else True with the call counted in the direct op's stats.
PyObject* direct_done(bool from_mode, const std::vector<int64_t>& counts,
                      std::chrono::steady_clock::time_point t0) {
  if (from_mode) return to_tuple(counts);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
  npu_dispatch::record_direct(npu_dispatch::kOpForeachCopy, counts, ns.count());
  Py_RETURN_TRUE;
}

// foreach_copy_direct(dsts, srcs, non_blocking[, from_mode]) -> bool | tuple  (lists or tuples)
// The public npu_dispatch.foreach_copy_ on the fast lane, counted in the direct op's stats.
// False, with nothing written, when the call needs the general path (anything the lane
// refuses, errors included: that path raises stock's). With `from_mode` (NpuFastCopyMode's
// torch-function front, its own dispatch mode the only one active) the count vector of
// execute.h comes back instead of True, for the mode's stats.
PyObject* foreach_copy_direct(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 3 && nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "foreach_copy_direct(dsts, srcs, non_blocking[, from_mode])");
    return nullptr;
  }
  const bool from_mode = nargs == 4 && PyObject_IsTrue(args[3]) == 1;
  const auto t0 = std::chrono::steady_clock::now();
  PyObject* dl = args[0];
  PyObject* sl = args[1];
  PyObject** ditems;
  PyObject** sitems;
  Py_ssize_t dn, sn;
  if (!seq_items(dl, &ditems, &dn) || !seq_items(sl, &sitems, &sn) || dn == 0 || dn != sn ||
      !plain_context(from_mode)) {
    Py_RETURN_FALSE;
  }
  // The GIL stays held from here to the copy (or the references below are taken), so the
  // lists cannot change under the raw TensorImpl pointers.
  const size_t n = static_cast<size_t>(dn);
  const auto caps = npu_dispatch::current_capabilities();  // the lane keeps pointers into it
  npu_dispatch::LaneCall call(n);
  c10::TensorImpl** impls = call.impls();
  if (!unpack_impls(dl, impls) || !unpack_impls(sl, impls + n)) Py_RETURN_FALSE;
  // Filled only when the copy drops the GIL; released last (on return, GIL held), after the
  // bumps have used the TensorImpl pointers it keeps alive.
  PyRefs refs;
  switch (call.prepare(*caps, c10::GradMode::is_enabled(), npu_dispatch::kReleaseGilBytes)) {
    case npu_dispatch::LaneCall::Step::Refused:
      Py_RETURN_FALSE;
    case npu_dispatch::LaneCall::Step::Copied:
      break;
    case npu_dispatch::LaneCall::Step::Prepared: {
      refs.reserve(2 * n);
      for (size_t i = 0; i < n; ++i) {
        refs.add(ditems[i]);
        refs.add(sitems[i]);
      }
      pybind11::gil_scoped_release no_gil;
      call.copy();
      break;
    }
  }
  return direct_done(from_mode, call.counts(), t0);
  END_HANDLE_TH_ERRORS
}

// touch_pairs(dsts: list, srcs: list) -> None. The benchmark's per-pair floor (npu_dispatch/bench):
// what any exact foreach copy repeats per pair on top of the bytes it moves (read both tensors'
// addresses and sizes, bump the destination's version counter), and nothing more. Not a copy.
PyObject* touch_pairs(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) ||
      PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
    PyErr_SetString(PyExc_TypeError, "touch_pairs(dsts: list, srcs: list) of equal lengths");
    return nullptr;
  }
  const size_t n = static_cast<size_t>(PyList_GET_SIZE(args[0]));
  std::vector<c10::TensorImpl*> impls(2 * n);
  if (!unpack_impls(args[0], impls.data()) || !unpack_impls(args[1], impls.data() + n)) {
    PyErr_SetString(PyExc_TypeError, "touch_pairs takes plain tensors");
    return nullptr;
  }
  for (size_t i = 0; i < 2 * n; ++i) {
    if (impls[i]->layout() != c10::kStrided || !impls[i]->unsafe_storage()) {
      PyErr_SetString(PyExc_TypeError, "touch_pairs takes strided tensors with storage");
      return nullptr;
    }
  }
  uintptr_t sink = 0;
  for (size_t i = 0; i < 2 * n; ++i) {
    const c10::TensorImpl* t = impls[i];
    sink += reinterpret_cast<uintptr_t>(t->unsafe_storage().data()) + t->storage_offset() + t->numel();
  }
  for (size_t i = 0; i < n; ++i) impls[i]->bump_version();
  asm volatile("" : : "r"(sink));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// region_probe() -> None. The benchmark's measure of what starting and joining the torch threads
// costs at that moment (npu_dispatch/bench): one empty parallel region on every thread. On the CI
// machine (a VM) it reads about 0.5 us in some stretches and 1.3 us in others, and every call
// that spreads its work over threads moves with it.
PyObject* region_probe(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t /*nargs*/) {
  std::atomic<int64_t> sink{0};
  const int64_t threads = at::get_num_threads();
  at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) { sink.fetch_add(e - b, std::memory_order_relaxed); });
  Py_RETURN_NONE;
}

// plan(dsts, srcs) -> tuple of ints (plan.cpp encode_plan). Not through the dispatcher: a
// tensor subclass would unwrap itself there, and the plan must see the subclass.
PyObject* plan(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "plan(dsts, srcs)");
    return nullptr;
  }
  PyRefs refs;
  npu_dispatch::BorrowedTensors dsts, srcs;
  if (!unpack(args[0], "dst", &refs, &dsts) || !unpack(args[1], "src", &refs, &srcs)) {
    return nullptr;
  }
  return to_tuple(npu_dispatch::plan_encoded(dsts, srcs));
  END_HANDLE_TH_ERRORS
}

PyObject* counts_or_none(const std::vector<int64_t>& v) {
  if (v.empty()) Py_RETURN_NONE;
  return to_tuple(v);
}

bool arity(Py_ssize_t nargs, Py_ssize_t lo, Py_ssize_t hi, const char* usage) {
  if (nargs >= lo && nargs <= hi) return true;
  PyErr_SetString(PyExc_TypeError, usage);
  return false;
}

// mode_route_enter(mode[, probe[, probe_dst, probe_src]]) -> None: `mode` (an NpuFastCopyMode)
// is pushed; the route may serve it (csrc/mode_route.h), installed on the first call. `probe`:
// the benchmark's floor; with the two tensors, it copies them instead of the call's lists
// (ValueError where the fast lane refuses that pair).
PyObject* mode_route_enter(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  static const char* usage = "mode_route_enter(mode[, probe[, probe_dst, probe_src]])";
  if (!arity(nargs, 1, 4, usage)) return nullptr;
  std::optional<std::pair<at::Tensor, at::Tensor>> probe_copy;
  if (nargs >= 3) {
    if (nargs != 4 || !THPVariable_Check(args[2]) || !THPVariable_Check(args[3])) {
      PyErr_SetString(PyExc_TypeError, usage);
      return nullptr;
    }
    if (PyObject_IsTrue(args[1]) != 1) {
      PyErr_SetString(PyExc_TypeError, "mode_route_enter: probe_dst and probe_src only with probe");
      return nullptr;
    }
    probe_copy.emplace(THPVariable_Unpack(args[2]), THPVariable_Unpack(args[3]));
  }
  npu_dispatch::install_mode_route();
  try {
    npu_dispatch::route_mode_entered(args[0], nargs >= 2 && PyObject_IsTrue(args[1]) == 1, probe_copy);
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// mode_route_exit(mode) -> tuple | None: popped; the route's counters for it since the last
// drain (native_stats.h layout), None if it was not entered.
PyObject* mode_route_exit(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 1, 1, "mode_route_exit(mode)")) return nullptr;
  return counts_or_none(npu_dispatch::route_mode_exited(args[0]));
  END_HANDLE_TH_ERRORS
}

// mode_route_drain(mode) -> tuple | None: the route's counters for an entered mode since the
// last drain.
PyObject* mode_route_drain(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 1, 1, "mode_route_drain(mode)")) return nullptr;
  return counts_or_none(npu_dispatch::drain_route_mode(args[0]));
  END_HANDLE_TH_ERRORS
}

PyObject* mode_route_calls(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t /*nargs*/) {
  return PyLong_FromLongLong(npu_dispatch::mode_route_calls());
}

PyMethodDef methods[] = {
    {"plan", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&plan)), METH_FASTCALL,
     "The plan of one _foreach_copy_, encoded; nothing is written."},
    {"foreach_copy_planned", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&foreach_copy_planned)),
     METH_FASTCALL, "Plan and execute one _foreach_copy_; returns the count vector."},
    {"foreach_copy_direct", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&foreach_copy_direct)),
     METH_FASTCALL, "The fast lane for the public foreach_copy_; False when the general path must run."},
    {"region_probe", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&region_probe)),
     METH_FASTCALL, "Benchmark probe: one empty parallel region on every torch thread."},
    {"touch_pairs", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&touch_pairs)),
     METH_FASTCALL, "Benchmark floor: read every pair's addresses and sizes, bump versions."},
    {"mode_route_enter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&mode_route_enter)),
     METH_FASTCALL, "NpuFastCopyMode pushed: its dispatch route may serve it."},
    {"mode_route_exit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&mode_route_exit)),
     METH_FASTCALL, "NpuFastCopyMode popped; returns the route's counters for it."},
    {"mode_route_drain", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&mode_route_drain)),
     METH_FASTCALL, "The route's counters for an entered NpuFastCopyMode since the last drain."},
    {"mode_route_calls", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&mode_route_calls)),
     METH_FASTCALL, "Calls the dispatch route has copied since load."},
    {nullptr, nullptr, 0, nullptr},
};

#define NPU_DISPATCH_STR2(x) #x
#define NPU_DISPATCH_STR(x) NPU_DISPATCH_STR2(x)
#define NPU_DISPATCH_CONCAT2(a, b) a##b
#define NPU_DISPATCH_CONCAT(a, b) NPU_DISPATCH_CONCAT2(a, b)

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, NPU_DISPATCH_STR(TORCH_EXTENSION_NAME), nullptr, -1, methods,
    nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

// The module name comes from torch.utils.cpp_extension (TORCH_EXTENSION_NAME).
extern "C" __attribute__((visibility("default"))) PyObject* NPU_DISPATCH_CONCAT(PyInit_, TORCH_EXTENSION_NAME)() {
  return PyModule_Create(&module_def);
}
