// The typed boundary between the C++ core and npu_dispatch's Python side: every plan, count
// vector, drained counter block and check result crosses as named Python objects built here, and
// the names themselves (reason kinds, paths, counted ops, capability flags) are exported from the
// C++ enums they belong to (planner/plan.h, planner/execute.h, dispatch/native_stats.h,
// planner/capability_table.h). Python keeps no list of numbers in step with C++.
//
// Every function returns a new reference, or nullptr with a Python error set.
#pragma once

#include <Python.h>

#include <cstdint>
#include <vector>

#include "cpu/copy_kernel.h"
#include "planner/plan.h"

namespace npu_dispatch::py {

// A list of make(item) for each item; nullptr (Python error set) where make returns nullptr.
template <typename T, typename F>
PyObject* list_of(const std::vector<T>& items, F make) {
  PyObject* l = PyList_New(static_cast<Py_ssize_t>(items.size()));
  if (l == nullptr) return nullptr;
  for (size_t k = 0; k < items.size(); ++k) {
    PyObject* item = make(items[k]);
    if (item == nullptr) {
      Py_DECREF(l);
      return nullptr;
    }
    PyList_SET_ITEM(l, static_cast<Py_ssize_t>(k), item);
  }
  return l;
}

// A count vector of planner/execute.h as (blocked: bool (strict refused the call; nothing
// written), paths: {path: (tensors, bytes, launches)}, reasons: {kind: pairs}), each dict holding
// only what the call used.
PyObject* counts(const std::vector<int64_t>& v);

// Drained counters (dispatch/native_stats.h OpStats::drain) as {op: (calls, fast_calls,
// fallback_calls, nanoseconds, {path: (calls, pairs, bytes, launches)}, {kind: (pairs, calls)})}
// for the ops with calls; an empty vector (an unknown scope) gives None.
PyObject* drained(const std::vector<int64_t>& v);

// A Plan (planner/plan.h) as a dict: n, stock (kind name or None), stock_a, stock_b, stock_sub,
// stock_launches (None: no device op takes the call whole), fallback_launches, runs [(members,
// numel)], groups [(members, launches, transfer)], stages [(members, numel, adjacent, launches)],
// fallback [(index, kind, sub)], empty [index].
PyObject* plan(const Plan& p);

// self_check()'s findings as {conversion: {"enabled", "variant", "fbgemm_split"}}.
PyObject* conversion_checks(const std::vector<ConversionCheck>& checks);

// The names the boundary uses: {"kinds", "paths", "fast_paths", "off_fast_paths", "counted_ops",
// "capability_flags" (bit k is the k-th name's), "fsdp_schemas"
// ({op name: schema} of the fsdp:: ops served, dispatch/dispatcher_facts.h)}.
PyObject* names();

}  // namespace npu_dispatch::py
