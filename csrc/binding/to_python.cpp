#include "binding/to_python.h"

#include "dispatch/dispatcher_facts.h"
#include "dispatch/native_stats.h"
#include "planner/capability_table.h"
#include "planner/execute.h"

namespace npu_dispatch::py {
namespace {

// Py_BuildValue-style helpers that own what they are given, even on failure.
// Once `d` is nullptr (an earlier step failed, a Python error set), later steps only release `v`.
PyObject* steal_into_dict(PyObject* d, const char* key, PyObject* v) {
  if (d == nullptr || v == nullptr || PyDict_SetItemString(d, key, v) != 0) {
    Py_XDECREF(v);
    Py_XDECREF(d);
    return nullptr;
  }
  Py_DECREF(v);
  return d;
}

PyObject* int_tuple(const int64_t* b, const int64_t* e) {
  PyObject* t = PyTuple_New(e - b);
  if (t == nullptr) return nullptr;
  for (Py_ssize_t k = 0; b + k != e; ++k) {
    PyObject* item = PyLong_FromLongLong(b[k]);
    if (item == nullptr) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, k, item);
  }
  return t;
}

PyObject* int_list(const std::vector<int64_t>& v, int64_t b, int64_t e) {
  PyObject* l = PyList_New(e - b);
  if (l == nullptr) return nullptr;
  for (int64_t k = b; k < e; ++k) {
    PyObject* item = PyLong_FromLongLong(v[k]);
    if (item == nullptr) {
      Py_DECREF(l);
      return nullptr;
    }
    PyList_SET_ITEM(l, k - b, item);
  }
  return l;
}

PyObject* str_tuple(const char* const* names, int n) {
  PyObject* t = PyTuple_New(n);
  if (t == nullptr) return nullptr;
  for (int k = 0; k < n; ++k) {
    PyObject* s = PyUnicode_FromString(names[k]);
    if (s == nullptr) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, k, s);
  }
  return t;
}

PyObject* str_tuple_where(const char* const* names, const bool* keep, int n) {
  std::vector<const char*> kept;
  for (int k = 0; k < n; ++k) {
    if (keep[k]) kept.push_back(names[k]);
  }
  return str_tuple(kept.data(), static_cast<int>(kept.size()));
}

// Sets d[key] = value (both new references, released here); false on failure.
bool set(PyObject* d, PyObject* key, PyObject* value) {
  const bool ok = key != nullptr && value != nullptr && PyDict_SetItem(d, key, value) == 0;
  Py_XDECREF(key);
  Py_XDECREF(value);
  return ok;
}

}  // namespace

PyObject* counts(const std::vector<int64_t>& v) {
  PyObject* paths = PyDict_New();
  PyObject* reasons = PyDict_New();
  bool ok = paths != nullptr && reasons != nullptr;
  for (int p = 0; ok && p < kNumPaths; ++p) {
    const int64_t* slot = v.data() + path_slot(static_cast<Path>(p), 0);
    if (slot[0] != 0) ok = set(paths, PyUnicode_FromString(kPathNames[p]), int_tuple(slot, slot + 3));
  }
  for (int k = 0; ok && k < kNumKinds; ++k) {
    const int64_t pairs = v[reason_slot(static_cast<Kind>(k))];
    if (pairs != 0) ok = set(reasons, PyUnicode_FromString(kKindNames[k]), PyLong_FromLongLong(pairs));
  }
  if (!ok) {
    Py_XDECREF(paths);
    Py_XDECREF(reasons);
    return nullptr;
  }
  return Py_BuildValue("(ONN)", (v[0] & kBlocked) != 0 ? Py_True : Py_False, paths, reasons);
}

PyObject* drained(const std::vector<int64_t>& v) {
  if (v.empty()) Py_RETURN_NONE;
  PyObject* out = PyDict_New();
  if (out == nullptr) return nullptr;
  const int len = op_stats_len();
  for (int op = 0; op < kNumCountedOps; ++op) {
    const int64_t* o = v.data() + static_cast<int64_t>(op) * len;
    if (o[0] == 0) continue;
    PyObject* paths = PyDict_New();
    PyObject* fallbacks = PyDict_New();
    bool ok = paths != nullptr && fallbacks != nullptr;
    for (int p = 0; ok && p < kNumPaths; ++p) {
      const int64_t* row = o + op_path_offset(p);
      if (row[0] != 0) ok = set(paths, PyUnicode_FromString(kPathNames[p]), int_tuple(row, row + 4));
    }
    for (int k = 0; ok && k < kNumKinds; ++k) {
      const int64_t* row = o + op_reason_offset(k);
      if (row[0] != 0) ok = set(fallbacks, PyUnicode_FromString(kKindNames[k]), int_tuple(row, row + 2));
    }
    PyObject* row = ok ? Py_BuildValue("(LLLLNN)", static_cast<long long>(o[0]), static_cast<long long>(o[1]),
                                       static_cast<long long>(o[2]), static_cast<long long>(o[3]), paths, fallbacks)
                       : nullptr;
    if (!ok) {
      Py_XDECREF(paths);
      Py_XDECREF(fallbacks);
    }
    if (!set(out, PyUnicode_FromString(kCountedOpNames[op]), row)) {
      Py_DECREF(out);
      return nullptr;
    }
  }
  return out;
}

PyObject* plan(const Plan& p) {
  PyObject* d = PyDict_New();
  const auto kind = [](Kind k) -> PyObject* {
    if (k == Kind::None) Py_RETURN_NONE;
    return PyUnicode_FromString(kKindNames[static_cast<int>(k)]);
  };
  d = steal_into_dict(d, "n", PyLong_FromLongLong(p.n));
  d = steal_into_dict(d, "stock", kind(p.stock));
  d = steal_into_dict(d, "stock_a", PyLong_FromLongLong(p.stock_a));
  d = steal_into_dict(d, "stock_b", PyLong_FromLongLong(p.stock_b));
  d = steal_into_dict(d, "stock_sub", PyLong_FromLongLong(p.stock_sub));
  PyObject* launches = nullptr;
  if (p.stock_launches >= 0) {
    launches = PyLong_FromLongLong(p.stock_launches);
  } else {
    Py_INCREF(Py_None);
    launches = Py_None;
  }
  d = steal_into_dict(d, "stock_launches", launches);
  d = steal_into_dict(d, "fallback_launches", PyLong_FromLongLong(p.fallback_launches));
  d = steal_into_dict(d, "runs", list_of(p.runs, [&](const Run& r) {
                        return Py_BuildValue("(NL)", int_list(p.run_members, r.begin, r.end),
                                             static_cast<long long>(r.numel));
                      }));
  d = steal_into_dict(d, "groups", list_of(p.groups, [&](const Group& g) {
                        return Py_BuildValue("(NLO)", int_list(p.group_members, g.begin, g.end),
                                             static_cast<long long>(g.launches), g.transfer ? Py_True : Py_False);
                      }));
  d = steal_into_dict(d, "stages", list_of(p.stages, [&](const Stage& s) {
                        return Py_BuildValue("(NLOL)", int_list(p.stage_members, s.begin, s.end),
                                             static_cast<long long>(s.numel), s.adjacent ? Py_True : Py_False,
                                             static_cast<long long>(s.launches));
                      }));
  d = steal_into_dict(d, "fallback", list_of(p.fallback, [&](const Fallback& f) {
                        return Py_BuildValue("(LNi)", static_cast<long long>(f.index), kind(f.kind),
                                             static_cast<int>(f.sub));
                      }));
  d = steal_into_dict(d, "empty", int_list(p.empty, 0, static_cast<int64_t>(p.empty.size())));
  return d;
}

PyObject* conversion_checks(const std::vector<ConversionCheck>& checks) {
  PyObject* out = PyDict_New();
  if (out == nullptr) return nullptr;
  for (const auto& c : checks) {
    PyObject* row = Py_BuildValue("{sOsssO}", "enabled", c.enabled ? Py_True : Py_False, "variant", c.variant,
                                  "fbgemm_split", c.fbgemm_split ? Py_True : Py_False);
    if (!set(out, PyUnicode_FromString(c.conversion), row)) {
      Py_DECREF(out);
      return nullptr;
    }
  }
  return out;
}

PyObject* names() {
  PyObject* d = PyDict_New();
  d = steal_into_dict(d, "kinds", str_tuple(kKindNames, kNumKinds));
  d = steal_into_dict(d, "paths", str_tuple(kPathNames, kNumPaths));
  d = steal_into_dict(d, "fast_paths", str_tuple_where(kPathNames, kFastPath, kNumPaths));
  d = steal_into_dict(d, "off_fast_paths", str_tuple_where(kPathNames, kOffFastPath, kNumPaths));
  d = steal_into_dict(d, "counted_ops", str_tuple(kCountedOpNames, kNumCountedOps));
  d = steal_into_dict(d, "capability_flags", str_tuple(kCapabilityFlagNames, kNumCapabilityFlags));
  PyObject* fsdp = PyDict_New();
  for (const auto& op : kFsdpOps) {
    if (fsdp != nullptr && !set(fsdp, PyUnicode_FromString(op.name), PyUnicode_FromString(op.schema))) {
      Py_DECREF(fsdp);
      fsdp = nullptr;
    }
  }
  d = steal_into_dict(d, "fsdp_schemas", fsdp);
  return d;
}

}  // namespace npu_dispatch::py
