// The hand-written entries of the measured hot path: the public foreach copy, all-gather copy-out
// and chunk_cat called from Python, which skip the dispatcher when nothing
// would act on the op. A torch.ops call boxes every tensor into an IValue and unboxes it into a
// fresh std::vector (a refcount bump, and a GIL round trip, per tensor); here the lists are read
// straight from the Python objects and the tensors only borrowed. Every other entry is bound by
// pybind11 (binding/module.cpp).
#include "binding/direct_entry.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <optional>
#include <vector>

#include "dispatch/mode_scope.h"
#include "fsdp/copies.h"
#include "planner/borrowed.h"
#include "planner/capability_table.h"
#include "planner/one_pass.h"

namespace npu_dispatch::binding {
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
bool unpack(PyObject* seq, const char* name, PyRefs* refs, BorrowedTensors* out, bool exact = false) {
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
  return !ti->has_symbolic_sizes_strides() && static_cast<int64_t>(t.nbytes()) > kReleaseGilBytes;
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

bool arity(Py_ssize_t nargs, Py_ssize_t n, const char* usage) {
  if (nargs == n) return true;
  PyErr_SetString(PyExc_TypeError, usage);
  return false;
}

// A direct entry's served call: `serve(&why)` (the GIL dropped where `release`), counted under
// `op` as dispatch/mode_scope.h record_call counts; False where it refused (nothing written).
template <typename Serve>
PyObject* serve_direct(CountedOp op, bool release, const Serve& serve) {
  const int64_t t0 = now_ns();
  Kind why;
  std::optional<CallResult> counts;
  {
    std::optional<pybind11::gil_scoped_release> no_gil;
    if (release) no_gil.emplace();
    counts = serve(&why);
  }
  if (!counts) Py_RETURN_FALSE;
  record_call(op, *counts, now_ns() - t0);
  Py_RETURN_TRUE;
}

// foreach_copy_direct(dsts, srcs, non_blocking) -> bool  (lists or tuples)
// The public npu_dispatch.foreach_copy_ on the one-pass plan, counted as dispatch/mode_scope.h record_call
// counts. False, with nothing written, when the call needs the general path (anything the one-pass plan
// refuses, errors included: that path raises stock's).
PyObject* foreach_copy_direct(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 3, "foreach_copy_direct(dsts, srcs, non_blocking)")) return nullptr;
  const int64_t t0 = now_ns();
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
  const auto caps = current_capabilities();  // the one-pass plan keeps pointers into it
  OnePassCall call(n);
  c10::TensorImpl** impls = call.impls();
  if (!unpack_impls(dl, impls) || !unpack_impls(sl, impls + n)) Py_RETURN_FALSE;
  // Filled only when the copy drops the GIL; released last (on return, GIL held), after the
  // bumps have used the TensorImpl pointers it keeps alive.
  PyRefs refs;
  switch (call.prepare(*caps, c10::GradMode::is_enabled(), kReleaseGilBytes)) {
    case OnePassCall::Step::Refused:
      Py_RETURN_FALSE;
    case OnePassCall::Step::Copied:
      break;
    case OnePassCall::Step::Prepared: {
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
  record_call(kOpForeachCopy, call.counts(), now_ns() - t0);
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

// copy_out_direct(src, sizes, dim, out) -> bool: the public function's entry without
// the dispatcher; False (nothing written) where it must go through it.
PyObject* copy_out_direct(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 4, "copy_out_direct(src, sizes, dim, out)")) return nullptr;
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
  BorrowedTensors out;
  std::vector<int64_t> sizes;
  if (!int_list(args[1], "all_gather_input_split_sizes", &sizes) ||
      !unpack(args[3], "out", release ? &refs : nullptr, &out, true)) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  // A tensor that requires grad under grad mode is refused by copy_out itself (the rule's
  // requires_grad).
  if (!unobserved()) Py_RETURN_FALSE;
  return serve_direct(kOpSplitWithSizesCopy, release,
                      [&](Kind* why) { return copy_out(src, sizes, dim, out, false, true, why); });
  END_HANDLE_TH_ERRORS
}

// chunk_cat_direct(tensors, dim, num_chunks, out) -> bool: as copy_out_direct.
PyObject* chunk_cat_direct(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!arity(nargs, 4, "chunk_cat_direct(tensors, dim, num_chunks, out)")) return nullptr;
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
  BorrowedTensors tensors;
  if (!unpack(args[0], "tensors", release ? &refs : nullptr, &tensors, true)) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  return serve_direct(kOpChunkCat, release,
                      [&](Kind* why) { return chunk_cat(tensors, dim, num_chunks, out, false, true, why); });
  END_HANDLE_TH_ERRORS
}

PyMethodDef kDirectMethods[] = {
    {"foreach_copy_direct", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&foreach_copy_direct)),
     METH_FASTCALL, "The one-pass plan for the public foreach_copy_; False when the general path must run."},
    {"copy_out_direct", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&copy_out_direct)),
     METH_FASTCALL, "The public all-gather copy-out without the dispatcher; False when it must go through it."},
    {"chunk_cat_direct", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&chunk_cat_direct)),
     METH_FASTCALL, "The public chunk_cat without the dispatcher; False when it must go through it."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

void add_direct_entries(pybind11::module_& m) {
  if (PyModule_AddFunctions(m.ptr(), kDirectMethods) != 0) throw pybind11::error_already_set();
}

}  // namespace npu_dispatch::binding
