#include "binding/to_python.h"

#include "planner/capability_table.h"

namespace npu_dispatch::binding {
namespace {

pyb::object kind_name(Kind k) {
  if (k == Kind::None) return pyb::none();
  return pyb::str(kKindNames[static_cast<int>(k)]);
}

pyb::list members(const std::vector<int64_t>& v, int64_t b, int64_t e) {
  pyb::list l;
  for (int64_t k = b; k < e; ++k) l.append(v[k]);
  return l;
}

pyb::tuple names_where(const bool* keep) {
  pyb::list out;
  for (int p = 0; p < kNumPaths; ++p) {
    if (keep == nullptr || keep[p]) out.append(kPathNames[p]);
  }
  return pyb::tuple(out);
}

}  // namespace

void bind_types(pyb::module_& m) {
  pyb::class_<CallResult>(m, "CallResult", "What one call did (csrc/planner/execute.h).")
      .def_readonly("executed", &CallResult::executed)
      .def_readonly("blocked", &CallResult::blocked)
      .def_readonly("bumped", &CallResult::bumped)
      .def_property_readonly("fast", &CallResult::fast)
      .def_property_readonly("fallback", &CallResult::fallback)
      .def_property_readonly("paths",
                             [](const CallResult& r) {
                               pyb::dict d;
                               for (int p = 0; p < kNumPaths; ++p) {
                                 const auto& c = r.paths[p];
                                 if (c.tensors != 0) d[kPathNames[p]] = pyb::make_tuple(c.tensors, c.bytes, c.launches);
                               }
                               return d;
                             })
      .def_property_readonly("reasons", [](const CallResult& r) {
        pyb::dict d;
        for (int k = 0; k < kNumKinds; ++k) {
          if (r.reasons[k] != 0) d[kKindNames[k]] = r.reasons[k];
        }
        return d;
      });
  pyb::class_<Capability>(m, "Capability", "One device type's fast path (csrc/planner/capability_table.h).")
      .def(pyb::init<>())
      .def_readwrite("whole_list_only", &Capability::whole_list)
      .def_readwrite("host_pass", &Capability::host_pass)
      .def_readwrite("batched_transfers", &Capability::batched_transfers)
      .def_readwrite("batched_keeps_versions", &Capability::batched_keeps_versions)
      .def_readwrite("max_per_launch", &Capability::max_per_launch)
      .def_readwrite("stage_bytes", &Capability::stage_bytes)
      .def("allow", [](Capability& c, c10::ScalarType src, c10::ScalarType dst) {
        c.pairs.set(static_cast<int>(src) * kNumDtypes + static_cast<int>(dst));
      })
      .def("allow_copy_dtypes", [](Capability& c, bool same, bool cross) {
        // The (src, dst) pairs of the dtypes the rule lets leave stock (planner/classify.h
        // copy_dtype): the same-dtype ones, the cross-dtype ones, or both.
        for (int s = 0; s < kNumDtypes; ++s) {
          for (int d = 0; d < kNumDtypes; ++d) {
            const bool ok = copy_dtype(static_cast<c10::ScalarType>(s)) && copy_dtype(static_cast<c10::ScalarType>(d));
            if (ok && (s == d ? same : cross)) c.pairs.set(s * kNumDtypes + d);
          }
        }
      });
}

pyb::object totals(const std::optional<StatsTotals>& t) {
  if (!t) return pyb::none();
  pyb::dict out;
  for (int op = 0; op < kNumCountedOps; ++op) {
    const OpTotals& o = (*t)[op];
    if (o.calls == 0) continue;
    pyb::dict paths, fallbacks;
    for (int p = 0; p < kNumPaths; ++p) {
      const auto& row = o.paths[p];
      if (row.calls != 0) {
        paths[kPathNames[p]] = pyb::make_tuple(row.calls, row.counts.tensors, row.counts.bytes, row.counts.launches);
      }
    }
    for (int k = 0; k < kNumKinds; ++k) {
      if (o.reasons[k].pairs != 0) fallbacks[kKindNames[k]] = pyb::make_tuple(o.reasons[k].pairs, o.reasons[k].calls);
    }
    out[pyb::str(kOwnedOps[op].counted())] =
        pyb::dict(pyb::arg("calls") = o.calls, pyb::arg("fast_calls") = o.fast_calls,
                  pyb::arg("fallback_calls") = o.fallback_calls, pyb::arg("seconds") = o.nanoseconds * 1e-9,
                  pyb::arg("paths") = paths, pyb::arg("fallbacks") = fallbacks);
  }
  return out;
}

pyb::dict plan(const Plan& p) {
  pyb::dict d;
  d["n"] = p.n;
  d["stock"] = kind_name(p.stock);
  d["stock_a"] = p.stock_a;
  d["stock_b"] = p.stock_b;
  d["stock_detail"] = sub_name(p.stock, p.stock_sub);
  d["no_fast_pair"] = p.no_fast_pair;
  d["own_op"] = p.own_op;
  d["launches"] = p.launches();
  d["leaves_fast_path"] = p.leaves_fast_path();
  d["fallback_launches"] = p.fallback_launches;
  pyb::list runs, groups, stages, fallback;
  for (const Run& r : p.runs) runs.append(pyb::make_tuple(members(p.run_members, r.begin, r.end), r.numel));
  for (const Group& g : p.groups) {
    groups.append(pyb::make_tuple(members(p.group_members, g.begin, g.end), g.launches, g.transfer));
  }
  for (const Stage& s : p.stages) {
    stages.append(pyb::make_tuple(members(p.stage_members, s.begin, s.end), s.numel, s.adjacent, s.launches));
  }
  for (const Fallback& f : p.fallback) fallback.append(pyb::make_tuple(f.index, kind_name(f.kind), sub_name(f.kind, f.sub)));
  d["runs"] = runs;
  d["groups"] = groups;
  d["stages"] = stages;
  d["fallback"] = fallback;
  d["empty"] = p.empty;
  return d;
}

pyb::dict conversion_checks(const std::vector<ConversionCheck>& checks) {
  pyb::dict out;
  for (const auto& c : checks) {
    out[c.conversion] = pyb::dict(pyb::arg("enabled") = c.enabled, pyb::arg("variant") = c.variant,
                                  pyb::arg("fbgemm_split") = c.fbgemm_split);
  }
  return out;
}

pyb::dict names() {
  pyb::list kinds, ops;
  for (int k = 0; k < kNumKinds; ++k) kinds.append(kKindNames[k]);
  for (int k = 0; k < kNumCountedOps; ++k) ops.append(kOwnedOps[k].counted());
  return pyb::dict(pyb::arg("kinds") = pyb::tuple(kinds), pyb::arg("paths") = names_where(nullptr),
                   pyb::arg("fast_paths") = names_where(kFastPath), pyb::arg("off_fast_paths") = names_where(kOffFastPath),
                   pyb::arg("counted_ops") = pyb::tuple(ops));
}

}  // namespace npu_dispatch::binding
