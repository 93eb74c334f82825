// The engine's per-call entry from Python. A torch.ops call boxes every tensor into an IValue
// and unboxes it into a fresh std::vector (a refcount bump, and a GIL round trip, per tensor);
// here the lists are read straight from the Python objects and the tensors only borrowed.
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>


#include <optional>
#include <vector>

#include "planner/borrowed.h"
#include "planner/capability_table.h"
#include "cpu/copy_kernel.h"
#include "planner/one_pass.h"
#include "planner/threaded_checks.h"
#include "cpu/stream_copy.h"
#include "planner/copy_call.h"
#include "dispatch/dispatcher_facts.h"
#include "planner/one_pass_call.h"
#include "dispatch/intercept.h"
#include "dispatch/mode_scope.h"
#include <torch/csrc/autograd/forward_grad.h>
#include "dispatch/native_stats.h"
#include "fsdp/copies.h"
#include "planner/execute.h"
#include "binding/to_python.h"
#include <ATen/ops/_chunk_cat.h>
#include <ATen/ops/split_with_sizes_copy.h>

#define NPU_DISPATCH_STR2(x) #x
#define NPU_DISPATCH_STR(x) NPU_DISPATCH_STR2(x)

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

// `exact`: a subclass item is refused too (a direct entry leaves it to the dispatcher path, where
// its __torch_function__ sees the call). `refs`: where the items' references are kept while the
// GIL is dropped; nullptr for a call that holds the GIL throughout (no thread can free them).
bool unpack(PyObject* seq, const char* name, PyRefs* refs, npu_dispatch::BorrowedTensors* out, bool exact = false) {
  PyObject* fast = PySequence_Fast(seq, "expected a list or tuple of Tensors");
  if (fast == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  if (refs != nullptr) refs->reserve(2 * n);
  out->reserve(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (exact ? !THPVariable_CheckExact(items[i]) : !THPVariable_Check(items[i])) {
      PyErr_Format(PyExc_TypeError, "%s[%zd] is a %s, not a Tensor", name, i, Py_TYPE(items[i])->tp_name);
      Py_DECREF(fast);
      return false;
    }
    if (refs != nullptr) refs->add(items[i]);
    out->push_back(THPVariable_Unpack(items[i]));
  }
  Py_DECREF(fast);
  return true;
}


// foreach_copy_planned(dsts, srcs, non_blocking, strict, bump: bool | None)
//   -> (flags, paths, reasons) (binding/to_python.h counts)
PyObject* foreach_copy_planned(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError,
                    "foreach_copy_planned(dsts, srcs, non_blocking, strict, bump)");
    return nullptr;
  }
  PyRefs refs;
  npu_dispatch::BorrowedTensors dsts, srcs;
  if (!unpack(args[0], "dst", &refs, &dsts) || !unpack(args[1], "src", &refs, &srcs)) {
    return nullptr;
  }
  const bool non_blocking = PyObject_IsTrue(args[2]) == 1;
  const bool strict = PyObject_IsTrue(args[3]) == 1;
  // None: stock's rule for where the call is made (planner/copy_call.h stock_bumps).
  const bool bump = args[4] == Py_None ? npu_dispatch::stock_bumps(dsts) : PyObject_IsTrue(args[4]) == 1;
  std::vector<int64_t> counts;
  {
    pybind11::gil_scoped_release no_gil;
    counts = npu_dispatch::plan_and_run(dsts, srcs, non_blocking, strict, bump);
  }
  return npu_dispatch::py::counts(counts);
  END_HANDLE_TH_ERRORS
}

// The gate of the direct entry: nothing between a Python caller and the kernel would act on the
// op. No dispatch mode and no torch function mode; no forward-AD level (VariableType acts on
// tangents); ADInplaceOrView not excluded (stock's copy_ loop bumps nothing below it: the
// dispatcher's path decides there); and no dispatch key switched on in this thread beyond the
// usual ones (a functorch layer's, the JIT tracer's). Calls through the dispatcher need no such
// gate: by BackendSelect, where the interception kernels sit (dispatch/intercept.h), every layer above
// has acted. Python adds the one thing C++ cannot see: a compiler tracing the caller.
bool unobserved() {
  static const c10::DispatchKeySet usual({c10::DispatchKey::BackendSelect, c10::DispatchKey::ADInplaceOrView});
  return c10::impl::TorchDispatchModeTLS::stack_len() == 0 && !at::impl::torch_function_mode_enabled() &&
         torch::autograd::ForwardADLevel::try_get_by_idx(0) == nullptr &&
         !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView) &&
         (c10::impl::tls_local_dispatch_key_set().included_ - usual).empty();
}

// Whether a direct entry's copy into (or out of, for the copy-out's all-gather output) `t` drops
// the GIL: above kReleaseGilBytes, as foreach_copy_direct's one-pass plan decides; below it the pass is far
// shorter than Python's switch interval and the list items need no references of their own. A
// tensor of symbolic sizes (whose nbytes() throws) keeps it: the entry refuses such a call.
bool drops_gil(const at::Tensor& t) {
  const c10::TensorImpl* ti = t.unsafeGetTensorImpl();
  return !ti->has_symbolic_sizes_strides() && static_cast<int64_t>(t.nbytes()) > npu_dispatch::kReleaseGilBytes;
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

// foreach_copy_direct(dsts, srcs, non_blocking) -> bool  (lists or tuples)
// The public npu_dispatch.foreach_copy_ on the one-pass plan, counted as dispatch/mode_scope.h record_call
// counts. False, with nothing written, when the call needs the general path (anything the one-pass plan
// refuses, errors included: that path raises stock's).
PyObject* foreach_copy_direct(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "foreach_copy_direct(dsts, srcs, non_blocking)");
    return nullptr;
  }
  const int64_t t0 = npu_dispatch::now_ns();
  PyObject* dl = args[0];
  PyObject* sl = args[1];
  PyObject** ditems;
  PyObject** sitems;
  Py_ssize_t dn, sn;
  if (!seq_items(dl, &ditems, &dn) || !seq_items(sl, &sitems, &sn) || dn == 0 || dn != sn ||
      !unobserved()) {
    Py_RETURN_FALSE;
  }
  // The GIL stays held from here to the copy (or the references below are taken), so the
  // lists cannot change under the raw TensorImpl pointers.
  const size_t n = static_cast<size_t>(dn);
  const auto caps = npu_dispatch::current_capabilities();  // the one-pass plan keeps pointers into it
  npu_dispatch::OnePassCall call(n);
  c10::TensorImpl** impls = call.impls();
  if (!unpack_impls(dl, impls) || !unpack_impls(sl, impls + n)) Py_RETURN_FALSE;
  // Filled only when the copy drops the GIL; released last (on return, GIL held), after the
  // bumps have used the TensorImpl pointers it keeps alive.
  PyRefs refs;
  switch (call.prepare(*caps, c10::GradMode::is_enabled(), npu_dispatch::kReleaseGilBytes)) {
    case npu_dispatch::OnePassCall::Step::Refused:
      Py_RETURN_FALSE;
    case npu_dispatch::OnePassCall::Step::Copied:
      break;
    case npu_dispatch::OnePassCall::Step::Prepared: {
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
  npu_dispatch::record_call(npu_dispatch::kOpForeachCopy, call.counts(), npu_dispatch::now_ns() - t0);
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

// plan(dsts, srcs) -> dict (binding/to_python.h plan). Not through the dispatcher: a
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
  return npu_dispatch::py::plan(npu_dispatch::plan_of(dsts, srcs));
  END_HANDLE_TH_ERRORS
}

bool arity(Py_ssize_t nargs, Py_ssize_t lo, Py_ssize_t hi, const char* usage) {
  if (nargs >= lo && nargs <= hi) return true;
  PyErr_SetString(PyExc_TypeError, usage);
  return false;
}

// The items of an exact list or tuple (empty for anything else).
std::vector<PyObject*> py_items(PyObject* seq) {
  PyObject** items;
  Py_ssize_t n;
  if (!seq_items(seq, &items, &n)) return {};
  return std::vector<PyObject*>(items, items + n);
}


bool int_list(PyObject* seq, const char* name, std::vector<int64_t>* out) {
  PyObject* fast = PySequence_Fast(seq, "expected a list or tuple of ints");
  if (fast == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Format(PyExc_TypeError, "%s[%zd] is not an int", name, i);
      Py_DECREF(fast);
      return false;
    }
    out->push_back(v);
  }
  Py_DECREF(fast);
  return true;
}

bool one_tensor(PyObject* o, const char* name, at::Tensor* out) {
  if (!THPVariable_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s is a %s, not a Tensor", name, Py_TYPE(o)->tp_name);
    return false;
  }
  *out = THPVariable_Unpack(o);
  return true;
}

// An int argument of a direct entry, or false (the error cleared: the dispatcher path raises it).
bool small_int(PyObject* o, int64_t* v) {
  if (!PyLong_Check(o)) return false;
  *v = PyLong_AsLongLong(o);
  if (*v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return true;
}

// `bump`: None is stock's rule where the call is made (below ADInplaceOrView, none).
bool bump_arg(PyObject* o) {
  return o == Py_None ? npu_dispatch::bumps_here() : PyObject_IsTrue(o) == 1;
}

// A served call's counts; a refused one runs stock's op here (its checks, messages, warnings,
// writes and bumps), or under `strict` writes nothing and reports the reason blocked.
template <typename Serve, typename Stock>
std::vector<int64_t> serve_or_stock(bool strict, int64_t pairs, Serve serve, Stock stock) {
  npu_dispatch::Kind why = npu_dispatch::Kind::MayRaise;
  std::optional<std::vector<int64_t>> counts;
  {
    pybind11::gil_scoped_release no_gil;
    counts = serve(&why);
  }
  if (counts) return *counts;
  if (strict) return npu_dispatch::blocked_counts(why, pairs);
  return npu_dispatch::stock_counts(why, pairs, stock());
}

// split_with_sizes_copy(src, sizes, dim, out, strict, bump: bool | None) -> counts (binding/to_python.h)
// (planner/execute.h): fsdp/copies.h, else aten::split_with_sizes_copy.out.
PyObject* split_with_sizes_copy(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 6, 6, "split_with_sizes_copy(src, sizes, dim, out, strict, bump)")) return nullptr;
  PyRefs refs;
  at::Tensor src;
  std::vector<int64_t> sizes;
  npu_dispatch::BorrowedTensors out;
  if (!one_tensor(args[0], "all_gather_output", &src) || !int_list(args[1], "all_gather_input_split_sizes", &sizes) ||
      !unpack(args[3], "out", &refs, &out)) {
    return nullptr;
  }
  const int64_t dim = PyLong_AsLongLong(args[2]);
  if (dim == -1 && PyErr_Occurred()) return nullptr;
  const bool strict = PyObject_IsTrue(args[4]) == 1;
  const bool bump = bump_arg(args[5]);
  return npu_dispatch::py::counts(serve_or_stock(
      strict, std::max<int64_t>(static_cast<int64_t>(out.size()), 1),
      [&](npu_dispatch::Kind* why) { return npu_dispatch::split_with_sizes_copy(src, sizes, dim, out, strict, bump, why); },
      [&] {
        at::split_with_sizes_copy_out(out, src, sizes, dim);
        const int64_t bytes = npu_dispatch::total_bytes(out);
        if (bump && !npu_dispatch::bumps_here()) {  // stock's out= op called from the caller's level bumps
          for (const auto& o : out.list()) o.unsafeGetTensorImpl()->bump_version();
        }
        return bytes;
      }));
  END_HANDLE_TH_ERRORS
}

// The (tensors, dim, num_chunks, out) leading both reduce-scatter copy-in entries' arguments.
bool chunk_cat_args(PyObject* const* args, PyRefs* refs, npu_dispatch::BorrowedTensors* tensors, int64_t* dim,
                    int64_t* num_chunks, at::Tensor* out) {
  if (!unpack(args[0], "tensors", refs, tensors) || !one_tensor(args[3], "out", out)) return false;
  *dim = PyLong_AsLongLong(args[1]);
  if (*dim == -1 && PyErr_Occurred()) return false;
  *num_chunks = PyLong_AsLongLong(args[2]);
  return !(*num_chunks == -1 && PyErr_Occurred());
}

// chunk_cat(tensors, dim, num_chunks, out, strict, bump: bool | None) -> counts (binding/to_python.h)
// (planner/execute.h): fsdp/copies.h, else aten::_chunk_cat.out.
PyObject* chunk_cat(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 6, 6, "chunk_cat(tensors, dim, num_chunks, out, strict, bump)")) return nullptr;
  PyRefs refs;
  npu_dispatch::BorrowedTensors tensors;
  at::Tensor out;
  int64_t dim = 0, num_chunks = 0;
  if (!chunk_cat_args(args, &refs, &tensors, &dim, &num_chunks, &out)) return nullptr;
  const bool strict = PyObject_IsTrue(args[4]) == 1;
  const bool bump = bump_arg(args[5]);
  return npu_dispatch::py::counts(serve_or_stock(
      strict, std::max<int64_t>(static_cast<int64_t>(tensors.size()), 1),
      [&](npu_dispatch::Kind* why) {
        // The op's Python kernel: its list's tensors just wrapped for Python (fsdp/copies.h).
        return npu_dispatch::chunk_cat(tensors, dim, num_chunks, out, strict, bump, /*split_checks=*/false, why);
      },
      [&] {
        at::_chunk_cat_out(out, tensors, dim, num_chunks);
        if (bump && !npu_dispatch::bumps_here()) out.unsafeGetTensorImpl()->bump_version();
        return npu_dispatch::total_bytes({out});
      }));
  END_HANDLE_TH_ERRORS
}

// chunk_cat_mixed_dtype(tensors, dim, num_chunks, out, strict) -> counts (binding/to_python.h): the
// Python dispatch-mode path's fsdp::chunk_cat_mixed_dtype (fsdp/copies.h), else the op's own
// kernel. Its handler runs below the op's ADInplaceOrView kernel, which bumps out: nothing here does.
PyObject* chunk_cat_mixed_dtype(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 5, 5, "chunk_cat_mixed_dtype(tensors, dim, num_chunks, out, strict)")) return nullptr;
  PyRefs refs;
  npu_dispatch::BorrowedTensors tensors;
  at::Tensor out;
  int64_t dim = 0, num_chunks = 0;
  if (!chunk_cat_args(args, &refs, &tensors, &dim, &num_chunks, &out)) return nullptr;
  const bool strict = PyObject_IsTrue(args[4]) == 1;
  return npu_dispatch::py::counts(serve_or_stock(
      strict, std::max<int64_t>(static_cast<int64_t>(tensors.size()), 1),
      [&](npu_dispatch::Kind* why) {
        return npu_dispatch::chunk_cat_mixed_dtype(tensors, dim, num_chunks, out, strict, false, why);
      },
      [&] {
        static const auto op = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("fsdp::chunk_cat_mixed_dtype", "")
                                   .typed<void(at::TensorList, int64_t, int64_t, at::Tensor&)>();
        op.call(tensors, dim, num_chunks, out);
        return npu_dispatch::total_bytes({out});
      }));
  END_HANDLE_TH_ERRORS
}

// Whether a direct call may skip the dispatcher: nothing would act on the op (unobserved()), and
// no tensor needs autograd (stock raises for an out= argument that requires grad).
bool direct_ok(at::TensorList a, at::TensorList b) {
  if (!unobserved()) return false;
  if (c10::GradMode::is_enabled()) {
    for (const auto l : {a, b}) {
      for (const auto& t : l) {
        if (t.requires_grad()) return false;
      }
    }
  }
  return true;
}

// split_with_sizes_copy_direct(src, sizes, dim, out) -> bool: the public function's entry without
// the dispatcher; False (nothing written) where it must go through it.
PyObject* split_with_sizes_copy_direct(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 4, 4, "split_with_sizes_copy_direct(src, sizes, dim, out)")) return nullptr;
  int64_t dim;
  PyObject** items;
  Py_ssize_t n;
  if (!THPVariable_CheckExact(args[0]) || !small_int(args[2], &dim) || !seq_items(args[3], &items, &n) ||
      !seq_items(args[1], &items, &n)) {
    Py_RETURN_FALSE;
  }
  const at::Tensor& src = THPVariable_Unpack(args[0]);
  const bool release = drops_gil(src);
  PyRefs refs;
  npu_dispatch::BorrowedTensors out;
  std::vector<int64_t> sizes;
  if (!int_list(args[1], "all_gather_input_split_sizes", &sizes) ||
      !unpack(args[3], "out", release ? &refs : nullptr, &out, true)) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  if (!direct_ok({src}, out)) Py_RETURN_FALSE;
  const int64_t t0 = npu_dispatch::now_ns();
  npu_dispatch::Kind why;
  std::optional<std::vector<int64_t>> counts;
  {
    std::optional<pybind11::gil_scoped_release> no_gil;
    if (release) no_gil.emplace();
    counts = npu_dispatch::split_with_sizes_copy(src, sizes, dim, out, false, true, &why);
  }
  if (!counts) Py_RETURN_FALSE;
  npu_dispatch::record_call(npu_dispatch::kOpSplitWithSizesCopy, *counts, npu_dispatch::now_ns() - t0);
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

// chunk_cat_direct(tensors, dim, num_chunks, out) -> bool: as split_with_sizes_copy_direct.
PyObject* chunk_cat_direct(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 4, 4, "chunk_cat_direct(tensors, dim, num_chunks, out)")) return nullptr;
  int64_t dim, num_chunks;
  PyObject** items;
  Py_ssize_t n;
  if (!THPVariable_CheckExact(args[3]) || !small_int(args[1], &dim) || !small_int(args[2], &num_chunks) ||
      !seq_items(args[0], &items, &n) || !unobserved()) {
    Py_RETURN_FALSE;
  }
  // An out or a tensor that requires grad is refused by chunk_cat itself.
  const at::Tensor& out = THPVariable_Unpack(args[3]);
  const bool release = drops_gil(out);
  PyRefs refs;
  npu_dispatch::BorrowedTensors tensors;
  if (!unpack(args[0], "tensors", release ? &refs : nullptr, &tensors, true)) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  const int64_t t0 = npu_dispatch::now_ns();
  npu_dispatch::Kind why;
  std::optional<std::vector<int64_t>> counts;
  {
    std::optional<pybind11::gil_scoped_release> no_gil;
    if (release) no_gil.emplace();
    counts = npu_dispatch::chunk_cat(tensors, dim, num_chunks, out, false, true, /*split_checks=*/true, &why);
  }
  if (!counts) Py_RETURN_FALSE;
  npu_dispatch::record_call(npu_dispatch::kOpChunkCat, *counts, npu_dispatch::now_ns() - t0);
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

// scope_new() -> int: a scope for one NpuFastCopyMode (dispatch/mode_scope.h).
PyObject* scope_new(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 0, 0, "scope_new()")) return nullptr;
  return PyLong_FromLongLong(npu_dispatch::scope_new());
  END_HANDLE_TH_ERRORS
}

int64_t scope_id(PyObject* o) { return PyLong_AsLongLong(o); }

PyObject* scope_free(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 1, 1, "scope_free(id)")) return nullptr;
  npu_dispatch::scope_free(scope_id(args[0]));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* scope_enter(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 1, 1, "scope_enter(id)")) return nullptr;
  npu_dispatch::scope_enter(scope_id(args[0]));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* scope_exit(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 1, 1, "scope_exit(id)")) return nullptr;
  npu_dispatch::scope_exit(scope_id(args[0]));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// scope_drain(id) -> dict | None: the scope's counters since the last drain (binding/to_python.h drained).
PyObject* scope_drain(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 1, 1, "scope_drain(id)")) return nullptr;
  return npu_dispatch::py::drained(npu_dispatch::scope_drain(scope_id(args[0])));
  END_HANDLE_TH_ERRORS
}

// stock_bumps(dsts) -> bool: whether stock's _foreach_copy_ called here bumps the destinations
// (planner/copy_call.h): what bump=None means, for a caller that plans under another guard.
PyObject* stock_bumps(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 1, 1, "stock_bumps(dsts)")) return nullptr;
  PyRefs refs;
  npu_dispatch::BorrowedTensors dsts;
  if (!unpack(args[0], "dst", &refs, &dsts)) return nullptr;
  return PyBool_FromLong(npu_dispatch::stock_bumps(dsts));
  END_HANDLE_TH_ERRORS
}

// A Python sequence of str as strings; false with the Python error set.
bool str_list(PyObject* seq, std::vector<std::string>* out) {
  for (PyObject* o : py_items(seq)) {
    const char* s = PyUnicode_AsUTF8(o);
    if (s == nullptr) return false;
    out->emplace_back(s);
  }
  return true;
}

// install(fsdp_ops: list[str]) -> None: the interception kernels (dispatch/intercept.h): the aten ops, and
// the fsdp:: ops named (those that exist with the schema served here).
PyObject* install(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 1, 1, "install(fsdp_ops)")) return nullptr;
  std::vector<std::string> names;
  if (!str_list(args[0], &names)) return nullptr;
  npu_dispatch::install_aten_interception();
  for (const auto& name : names) npu_dispatch::install_fsdp_interception(name);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* fact_tuple(const npu_dispatch::Fact& f) {
  return Py_BuildValue("(sOs)", f.name.c_str(), f.holds ? Py_True : Py_False, f.detail.c_str());
}

// static_facts(fsdp_ops: list[str]) -> list[(name, holds, detail)] (dispatch/dispatcher_facts.h).
PyObject* static_facts(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 1, 1, "static_facts(fsdp_ops)")) return nullptr;
  std::vector<std::string> names;
  if (!str_list(args[0], &names)) return nullptr;
  return npu_dispatch::py::list_of(npu_dispatch::static_facts(names), fact_tuple);
  END_HANDLE_TH_ERRORS
}

// live_fact() -> (name, holds, detail): after install (dispatch/dispatcher_facts.h).
PyObject* live_fact(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t /*nargs*/) {
  HANDLE_TH_ERRORS
  return fact_tuple(npu_dispatch::live_fact());
  END_HANDLE_TH_ERRORS
}

// install_in_reach_marker(op_name: str) -> bool; in_reach_modes() -> int (dispatch/intercept.h).
PyObject* install_in_reach_marker(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 1, 1, "install_in_reach_marker(op_name)")) return nullptr;
  const char* name = PyUnicode_AsUTF8(args[0]);
  if (name == nullptr) return nullptr;
  return PyBool_FromLong(npu_dispatch::install_in_reach_marker(name));
  END_HANDLE_TH_ERRORS
}

PyObject* in_reach_modes(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t /*nargs*/) {
  return PyLong_FromLongLong(npu_dispatch::in_reach_modes());
}

// install_passthrough(op_name, overload) -> None: counts an owned op of an unknown schema.
PyObject* install_passthrough(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 2, 2, "install_passthrough(op_name, overload)")) return nullptr;
  const char* name = PyUnicode_AsUTF8(args[0]);
  const char* overload = PyUnicode_AsUTF8(args[1]);
  if (name == nullptr || overload == nullptr) return nullptr;
  npu_dispatch::install_passthrough(name, overload);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// stock_foreach_copy(dsts, srcs, non_blocking) -> None: stock's op, the interception kernels
// stepping aside (planner/copy_call.h).
PyObject* stock_foreach_copy(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 3, 3, "stock_foreach_copy(dsts, srcs, non_blocking)")) return nullptr;
  PyRefs refs;
  npu_dispatch::BorrowedTensors dsts, srcs;
  if (!unpack(args[0], "dst", &refs, &dsts) || !unpack(args[1], "src", &refs, &srcs)) return nullptr;
  const bool non_blocking = PyObject_IsTrue(args[2]) == 1;
  {
    pybind11::gil_scoped_release no_gil;
    npu_dispatch::stock_foreach_copy(dsts, srcs, non_blocking);
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// info() -> dict: the CPU kernel's counters (passes, work items, destination bytes, bytes copied with
// streaming stores), the calls the one-pass plan and its threaded checks took, the bytes moved from
// which a pass streams.
PyObject* info(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t /*nargs*/) {
  HANDLE_TH_ERRORS
  const auto k = npu_dispatch::kernel_counters();
  return Py_BuildValue("{sLsLsLsLsLsLsL}", "kernel_passes", static_cast<long long>(k[0]), "kernel_items",
                       static_cast<long long>(k[1]), "kernel_bytes", static_cast<long long>(k[2]),
                       "kernel_streamed_bytes", static_cast<long long>(k[3]), "one_pass_calls",
                       static_cast<long long>(npu_dispatch::one_pass_calls()), "threaded_check_calls",
                       static_cast<long long>(npu_dispatch::threaded_check_calls()), "stream_moved_bytes",
                       static_cast<long long>(npu_dispatch::stream_moved_bytes()));
  END_HANDLE_TH_ERRORS
}

// self_check() -> dict: which CPU conversions matched stock at load (binding/to_python.h).
PyObject* self_check(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t /*nargs*/) {
  HANDLE_TH_ERRORS
  return npu_dispatch::py::conversion_checks(npu_dispatch::self_check());
  END_HANDLE_TH_ERRORS
}

// drain_stats() -> dict: the direct ops' counters since the last drain (binding/to_python.h drained).
PyObject* drain_stats(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t /*nargs*/) {
  HANDLE_TH_ERRORS
  return npu_dispatch::py::drained(npu_dispatch::drain_direct());
  END_HANDLE_TH_ERRORS
}

// set_capabilities(device_types: list[str], table: list[int], dtypes: list[torch.dtype]) -> None
// (planner/capability_table.h wire format).
PyObject* set_capabilities(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 3, 3, "set_capabilities(device_types, table, dtypes)")) return nullptr;
  std::vector<std::string> names;
  std::vector<int64_t> table;
  std::vector<c10::ScalarType> dtypes;
  if (!str_list(args[0], &names)) return nullptr;
  for (PyObject* o : py_items(args[1])) {
    const long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return nullptr;
    table.push_back(v);
  }
  for (PyObject* o : py_items(args[2])) {
    if (!THPDtype_Check(o)) {
      PyErr_SetString(PyExc_TypeError, "set_capabilities: dtypes must be torch.dtype");
      return nullptr;
    }
    dtypes.push_back(reinterpret_cast<THPDtype*>(o)->scalar_type);
  }
  npu_dispatch::set_capabilities(names, table, dtypes);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// names() -> dict: the boundary's names (binding/to_python.h).
PyObject* names(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t /*nargs*/) {
  HANDLE_TH_ERRORS
  return npu_dispatch::py::names();
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"names", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&names)), METH_FASTCALL,
     "The names of reason kinds, paths, counted ops and capability flags."},
    {"plan", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&plan)), METH_FASTCALL,
     "The plan of one _foreach_copy_, as a dict; nothing is written."},
    {"split_with_sizes_copy_direct",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&split_with_sizes_copy_direct)), METH_FASTCALL,
     "The public split_with_sizes_copy without the dispatcher; False when it must go through it."},
    {"chunk_cat_direct", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&chunk_cat_direct)),
     METH_FASTCALL, "The public chunk_cat without the dispatcher; False when it must go through it."},
    {"split_with_sizes_copy", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&split_with_sizes_copy)),
     METH_FASTCALL, "FSDP2's all-gather copy-out through the fast path; returns (blocked, paths, reasons)."},
    {"chunk_cat", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&chunk_cat)), METH_FASTCALL,
     "FSDP2's reduce-scatter copy-in through the fast path; returns (blocked, paths, reasons)."},
    {"foreach_copy_planned", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&foreach_copy_planned)),
     METH_FASTCALL, "Plan and execute one _foreach_copy_; returns (blocked, paths, reasons)."},
    {"foreach_copy_direct", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&foreach_copy_direct)),
     METH_FASTCALL, "The one-pass plan for the public foreach_copy_; False when the general path must run."},
    {"scope_new", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&scope_new)), METH_FASTCALL,
     "A scope for one NpuFastCopyMode."},
    {"scope_free", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&scope_free)), METH_FASTCALL,
     "Forget a scope."},
    {"scope_enter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&scope_enter)), METH_FASTCALL,
     "Enter a scope on this thread."},
    {"scope_exit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&scope_exit)), METH_FASTCALL,
     "Exit a scope on this thread."},
    {"scope_drain", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&scope_drain)), METH_FASTCALL,
     "A scope's counters since the last drain."},
    {"install", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&install)), METH_FASTCALL,
     "Register the interception kernels."},
    {"chunk_cat_mixed_dtype", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&chunk_cat_mixed_dtype)),
     METH_FASTCALL, "torch 2.15's reduce-scatter copy-in through the fast path; returns (blocked, paths, reasons)."},
    {"stock_bumps", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&stock_bumps)), METH_FASTCALL,
     "Whether stock's _foreach_copy_ called here bumps the destinations."},
    {"static_facts", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&static_facts)), METH_FASTCALL,
     "The dispatcher facts the interception kernels rely on, before installing them."},
    {"live_fact", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&live_fact)), METH_FASTCALL,
     "One live call through the installed kernels."},
    {"install_in_reach_marker", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&install_in_reach_marker)),
     METH_FASTCALL, "The ADInplaceOrView marker of the Python dispatch-mode path."},
    {"in_reach_modes", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&in_reach_modes)), METH_FASTCALL,
     "What the innermost marked _foreach_copy_ found: Python modes on the stack, or -1."},
    {"install_passthrough", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&install_passthrough)), METH_FASTCALL,
     "Count an owned op of an unknown schema."},
    {"stock_foreach_copy", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&stock_foreach_copy)),
     METH_FASTCALL, "Stock's _foreach_copy_, the interception kernels stepping aside."},
    {"info", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&info)), METH_FASTCALL,
     "The kernel's and the one-pass plan's counters."},
    {"self_check", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&self_check)), METH_FASTCALL,
     "Which CPU conversions matched stock at load."},
    {"drain_stats", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&drain_stats)), METH_FASTCALL,
     "The direct ops' counters since the last drain."},
    {"set_capabilities", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&set_capabilities)), METH_FASTCALL,
     "Push the capability table in force."},
    {nullptr, nullptr, 0, nullptr},
};

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
