// The extension module: pybind11 bindings of every entry but the hand-written hot ones
// (binding/direct_entry.h). C++ errors reach Python as torch's own (type and message), and C++
// warnings as Python warnings (torch::wrap_pybind_function).
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "binding/direct_entry.h"
#include "binding/to_python.h"
#include "cpu/byte_pass.h"
#include "cpu/copy_kernel.h"
#include "cpu/byte_copy.h"
#include "dispatch/dispatcher_facts.h"
#include "dispatch/intercept.h"
#include "dispatch/mode_scope.h"
#include "fsdp/copies.h"
#include "planner/capability_table.h"
#include "planner/copy_call.h"
#include "planner/one_pass.h"

namespace npu_dispatch::binding {
namespace {

using Tensors = std::vector<at::Tensor>;

// `bump`: None is stock's rule where the call is made (below ADInplaceOrView, none).
bool bump_or_stock_rule(std::optional<bool> bump) { return bump.value_or(bumps_here()); }

pyb::tuple fact(const Fact& f) { return pyb::make_tuple(f.name, f.holds, f.detail); }

Kind kind_named(const std::string& name) {
  for (int k = 0; k < kNumKinds; ++k) {
    if (name == kKindNames[k]) return static_cast<Kind>(k);
  }
  TORCH_CHECK(false, "npu_dispatch: no such reason: ", name);
}

}  // namespace
}  // namespace npu_dispatch::binding

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace npu_dispatch;
  using namespace npu_dispatch::binding;
  namespace pyb = pybind11;
  bind_types(m);
  add_direct_entries(m);

  // The planned copies: the debugging mode's handlers and the library ops' Python kernels. The GIL
  // is released while C++ runs; results cross as CallResult.
  m.def("foreach_copy_planned",
        torch::wrap_pybind_function_no_gil([](const Tensors& dsts, const Tensors& srcs, bool non_blocking, bool strict,
                                              std::optional<bool> bump) {
          return plan_and_run(dsts, srcs, non_blocking, strict, bump);
        }),
        "Plan and execute one _foreach_copy_ (planner/copy_call.h plan_and_run).");
  m.def("all_gather_copy_in",
        torch::wrap_pybind_function_no_gil([](const Tensors& inputs, const at::Tensor& out,
                                              const std::vector<int64_t>& sizes, int64_t numel, int64_t rank,
                                              bool strict, std::optional<bool> bump) {
          CallResult counts;
          auto [slice, output] = all_gather_copy_in(inputs, out, sizes, numel, rank, strict, bump, &counts);
          return std::make_tuple(std::move(slice), std::move(output), std::move(counts));
        }),
        "FSDP2's all-gather copy-in: (slice, output, CallResult) (planner/copy_call.h).");
  m.def("copy_out",
        torch::wrap_pybind_function_no_gil([](const at::Tensor& src, const std::vector<int64_t>& sizes, int64_t dim,
                                              const Tensors& out, bool strict, std::optional<bool> bump) {
          return copy_out_or_stock(src, sizes, dim, out, strict, bump_or_stock_rule(bump));
        }),
        "FSDP2's all-gather copy-out through the fast path, else stock's op (fsdp/copies.h).");
  m.def("chunk_cat",
        torch::wrap_pybind_function_no_gil([](const Tensors& tensors, int64_t dim, int64_t num_chunks,
                                              const at::Tensor& out, bool strict, std::optional<bool> bump,
                                              bool mixed) {
          return chunk_cat_or_stock(tensors, dim, num_chunks, out, strict, bump_or_stock_rule(bump), mixed);
        }),
        pyb::arg("tensors"), pyb::arg("dim"), pyb::arg("num_chunks"), pyb::arg("out"), pyb::arg("strict"),
        pyb::arg("bump") = pyb::none(), pyb::arg("mixed") = false,
        "FSDP2's reduce-scatter copy-in through the fast path, else stock's op (fsdp/copies.h).");
  m.def("stock_foreach_copy",
        torch::wrap_pybind_function_no_gil([](const Tensors& dsts, const Tensors& srcs, bool non_blocking) {
          stock_foreach_copy(dsts, srcs, non_blocking);
        }),
        "Stock's _foreach_copy_, the interception kernels stepping aside.");
  // `with module.StockCall():` the owned ops called inside pass the interception kernels by,
  // uncounted (planner/copy_call.h StockCall): the debugging mode's references.
  struct StockCallScope {
    std::optional<StockCall> held;
  };
  pyb::class_<StockCallScope>(m, "StockCall")
      .def(pyb::init<>())
      .def("__enter__", [](StockCallScope& s) { s.held.emplace(); })
      .def("__exit__", [](StockCallScope& s, const pyb::args&) { s.held.reset(); });
  m.def("functional_outputs",
        torch::wrap_pybind_function([](const Tensors& dsts) {
          Tensors outs;
          for (const auto& d : dsts) outs.push_back(functional_output(d));
          return outs;
        }),
        "The outputs stock's functional _foreach_copy allocates for these destinations (planner/copy_call.h).");
  m.def("foreach_copy_bumps_here", torch::wrap_pybind_function([](const Tensors& dsts) { return foreach_copy_bumps_here(dsts); }),
        "Whether stock's _foreach_copy_ called here bumps the destinations.");
  m.def("passthrough_counts",
        [](const std::string& qualified, const std::string& why, const pyb::args& args, const pyb::kwargs& kwargs) {
          // The result of a call the Python paths hand to stock whole, counted as the interception's
          // passthrough counts one (dispatch/intercept.h whole_call_counts).
          const auto [name, overload] = split_qualified(qualified);
          const auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName(std::string(name), std::string(overload)));
          TORCH_CHECK(op.has_value(), "npu_dispatch: no such op: ", qualified);
          const auto stack = torch::jit::createStackForSchema(op->schema(), args, kwargs, std::nullopt);
          return whole_call_counts(*op, stack, kind_named(why));
        },
        "The CallResult of a call of `qualified` handed to stock whole for reason `why`.");
  m.def("plan", torch::wrap_pybind_function([](const Tensors& dsts, const Tensors& srcs) { return plan(plan_of(dsts, srcs)); }),
        "The plan of one _foreach_copy_, as a dict; nothing is written.");

  // The mode's scopes (dispatch/mode_scope.h) and counters.
  m.def("scope_new", torch::wrap_pybind_function(&scope_new));
  m.def("scope_free", torch::wrap_pybind_function(&scope_free));
  m.def("scope_enter", torch::wrap_pybind_function(&scope_enter));
  m.def("scope_exit", torch::wrap_pybind_function(&scope_exit));
  m.def("scope_drain", torch::wrap_pybind_function([](int64_t id) { return totals(scope_drain(id)); }));
  m.def("drain_stats", torch::wrap_pybind_function([] { return totals(drain_direct()); }),
        "The direct ops' counters since the last drain.");

  // Installing the interception (dispatch/intercept.h) and the facts it relies on.
  m.def("static_facts", torch::wrap_pybind_function([](const std::vector<std::string>& served) {
          pyb::list out;
          for (const auto& f : static_facts(served)) out.append(fact(f));
          return out;
        }));
  m.def("install", torch::wrap_pybind_function(&install_interception));
  m.def("live_fact", torch::wrap_pybind_function([] { return fact(live_fact()); }));
  m.def("install_passthrough", torch::wrap_pybind_function(&install_passthrough));
  m.def("install_in_reach_marker", torch::wrap_pybind_function(&install_in_reach_marker));
  m.def("in_reach_modes", &in_reach_modes);

  // The capability table and what the library reports about itself.
  m.def("set_capabilities",
        torch::wrap_pybind_function([](const std::vector<std::pair<std::string, std::optional<Capability>>>& e) {
          set_capabilities(e);
        }),
        "Push the capability table in force: [(device type, Capability or None)].");
  m.def("names", &names, "The names of reason kinds, paths and counted ops.");
  m.def("self_check", torch::wrap_pybind_function([] { return conversion_checks(self_check()); }),
        "Which CPU conversions matched stock at load.");
  m.def("kernel_pairs", torch::wrap_pybind_function([] {
          // Of the dtypes the rule lets leave stock (planner/classify.h copy_dtype).
          std::vector<std::pair<at::ScalarType, at::ScalarType>> out;
          for (const auto& [s, d] : kernel_pairs()) {
            if (copy_dtype(s) && copy_dtype(d)) out.emplace_back(s, d);
          }
          return out;
        }),
        "The (src, dst) dtype pairs the CPU kernel copies as stock does, after the self-check.");
  m.def("info", [] {
    const KernelCounters k = kernel_counters();
    return pyb::dict(pyb::arg("kernel_passes") = k.passes, pyb::arg("kernel_items") = k.items,
                     pyb::arg("kernel_bytes") = k.bytes, pyb::arg("kernel_streamed_bytes") = k.streamed,
                     pyb::arg("one_pass_calls") = one_pass_calls(),
                     pyb::arg("stream_moved_bytes") = stream_moved_bytes());
  });
}
