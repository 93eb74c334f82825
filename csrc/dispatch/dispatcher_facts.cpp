#include "dispatch/dispatcher_facts.h"

#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>

#include <optional>
#include <sstream>
#include <string_view>

#include "dispatch/mode_scope.h"
#include "dispatch/native_stats.h"

namespace npu_dispatch {
namespace {


// An op by its qualified name, "ns::name[.overload]".
std::optional<c10::OperatorHandle> find(std::string_view qualified) {
  const auto [name, overload] = split_qualified(qualified);
  return c10::Dispatcher::singleton().findOp(c10::OperatorName(std::string(name), std::string(overload)));
}

}  // namespace

std::vector<Fact> static_facts(const std::vector<std::string>& served) {
  std::vector<Fact> facts;
  std::vector<std::string> owned;
  for (const auto& row : kOwnedOps) {
    if (!row.intercepted || row.ns() != "aten") continue;
    const std::string name(row.qualified());
    const auto op = find(name);
    std::ostringstream found;
    if (op) found << op->schema();
    const bool same = op.has_value() && found.str() == row.schema;
    facts.push_back({"schema of " + name, same,
                     same ? row.schema : (op ? "found " + found.str() + ", kernels typed on " + row.schema : "no such op")});
    if (op) owned.push_back(name);
  }
  const std::string foreach_copy(kOwnedOps[kOpAtenForeachCopy].qualified());
  const auto fc = find(foreach_copy);
  const bool inplace_kernel = fc && fc->hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView);
  facts.push_back({"no ADInplaceOrView kernel on " + foreach_copy, fc.has_value() && !inplace_kernel,
                   inplace_kernel ? "found one: its version bumps and the planner's would double"
                                  : "the planner moves the version counters, once per destination"});
  owned.insert(owned.end(), served.begin(), served.end());
  for (const auto& name : owned) {
    const auto op = find(name);
    const bool implicit = op && op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
    facts.push_back({"no CompositeImplicitAutograd kernel on " + name, op.has_value() && !implicit,
                     !op ? "no such op"
                         : implicit ? "found one: calls decompose above BackendSelect and never reach the kernel"
                                    : "calls reach BackendSelect"});
  }
  return facts;
}

Fact live_fact() {
  Fact f{"a _foreach_copy_ in a scope reaches the kernel and moves the counter once", false, ""};
  // A normal tensor's call from the top of the dispatcher: no inference mode. (The caller's TLS
  // dispatch key sets stay as they are: NpuFastCopyMode() installs from ordinary Python code.)
  c10::InferenceMode normal(false);
  const at::Tensor d = at::zeros({2});
  const at::Tensor s = at::full({2}, 3.0);
  const int64_t before = d._version();
  const int64_t id = scope_new();
  try {
    scope_enter(id);
    try {
      at::_foreach_copy_({d}, {s}, false);
    } catch (...) {
      scope_exit(id);
      throw;
    }
    scope_exit(id);
  } catch (const std::exception& e) {
    scope_free(id);
    f.detail = std::string("the call raised: ") + e.what();
    return f;
  }
  const auto counts = scope_drain(id);
  scope_free(id);
  const int64_t calls = counts ? (*counts)[kOpAtenForeachCopy].calls : 0;
  const int64_t bumps = d._version() - before;
  const bool copied = at::equal(d, s);
  f.holds = calls == 1 && bumps == 1 && copied;
  std::ostringstream o;
  o << "kernel calls " << calls << " (1 expected), version bumps " << bumps << " (1 expected), "
    << (copied ? "copied" : "not copied");
  f.detail = o.str();
  return f;
}

}  // namespace npu_dispatch
