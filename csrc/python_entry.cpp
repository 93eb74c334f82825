// The engine's per-call entry from Python. A torch.ops call boxes every tensor into an IValue
// and unboxes it into a fresh std::vector (a refcount bump, and a GIL round trip, per tensor);
// here the lists are read straight from the Python objects and the tensors only borrowed.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

#include "borrowed.h"
#include "copy_call.h"

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

PyMethodDef methods[] = {
    {"plan", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&plan)), METH_FASTCALL,
     "The plan of one _foreach_copy_, encoded; nothing is written."},
    {"foreach_copy_planned", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&foreach_copy_planned)),
     METH_FASTCALL, "Plan and execute one _foreach_copy_; returns the count vector."},
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
