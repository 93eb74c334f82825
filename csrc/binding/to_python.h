// The typed boundary: what C++ hands Python, as named fields. Every name comes from a C++ table
// (Kind, Path, CountedOp); Python never reads a number that stands for an enum value.
#pragma once

#include <torch/extension.h>

#include <optional>
#include <vector>

#include "cpu/copy_kernel.h"
#include "dispatch/native_stats.h"
#include "planner/execute.h"
#include "planner/plan.h"

namespace npu_dispatch::binding {

namespace pyb = pybind11;

// Registers CallResult (executed, blocked, bumped, paths {path: (tensors, bytes, launches)} of
// the paths used, reasons {kind: pairs}) and Capability on `m`.
void bind_types(pyb::module_& m);

// Drained counters as {op: {"calls", "fast_calls", "fallback_calls", "seconds",
// "paths": {path: (calls, pairs, bytes, launches)}, "fallbacks": {kind: (pairs, calls)}}} for
// the ops with calls; None for an unknown scope.
pyb::object totals(const std::optional<StatsTotals>& t);

// A Plan as a dict: n, stock (kind name or None), stock_a, stock_b, stock_detail, own_op (the
// device's own op takes the call whole), no_fast_pair, launches, leaves_fast_path (what strict
// refuses), fallback_launches, runs
// [(members, numel)], groups [(members, launches, transfer)], stages [(members, numel, adjacent,
// launches)], fallback [(index, kind, detail)], empty [index]. A detail names the side or
// variant of a reason ("dst", "src", "no_broadcast", "src_over_dst"...; planner/classify.h
// sub_name).
pyb::dict plan(const Plan& p);

// self_check()'s findings as {conversion: {"enabled", "variant", "fbgemm_split"}}.
pyb::dict conversion_checks(const std::vector<ConversionCheck>& checks);

// {"kinds", "paths", "fast_paths", "off_fast_paths", "counted_ops"}: the names above, in order.
pyb::dict names();

}  // namespace npu_dispatch::binding
