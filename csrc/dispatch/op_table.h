// The owned ops as C++ sees them: the rows of dispatch/owned_ops.h, expanded once here. Counting,
// stats, the dispatcher facts, the interception's install and the boundary's names all read this.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace npu_dispatch {

// One enumerator per row of owned_ops.h, in row order: the op a call is counted under.
enum CountedOp : int {
#define NPU_DISPATCH_STOCK_OP(id, kernel, wrapper, copy, schema) kOp##id,
#define NPU_DISPATCH_LIBRARY_OP(id, kernel, wrapper, copy, schema) kOp##id,
#include "dispatch/owned_ops.h"
#undef NPU_DISPATCH_STOCK_OP
#undef NPU_DISPATCH_LIBRARY_OP
  kNumCountedOps
};

// "aten::add.Tensor" -> {"aten::add", "Tensor"}; "fsdp::chunk_cat" -> {"fsdp::chunk_cat", ""}: an
// op's qualified name, as the dispatcher's OperatorName holds it.
inline std::pair<std::string_view, std::string_view> split_qualified(std::string_view qualified) {
  const auto dot = qualified.find('.');
  if (dot == std::string_view::npos) return {qualified, {}};
  return {qualified.substr(0, dot), qualified.substr(dot + 1)};
}

struct OwnedOp {
  const char* schema;   // "fsdp::chunk_cat(Tensor[] tensors, ...) -> ()"
  const char* wrapper;  // npu_dispatch/engine.py's serving function
  bool intercepted;     // a stock op, served at BackendSelect (else the library's own op)

  // "aten::add.Tensor": the schema's qualified name, with its overload if any.
  std::string_view qualified() const {
    const std::string_view s(schema);
    return s.substr(0, s.find('('));
  }
  // "aten::add": the name without the overload.
  std::string_view name() const { return split_qualified(qualified()).first; }
  // "Tensor", or "" for the default overload.
  std::string_view overload() const { return split_qualified(qualified()).second; }
  // "fsdp": the namespace.
  std::string_view ns() const { return name().substr(0, name().find("::")); }
  // "add.Tensor": the name inside its namespace, as torch::Library::impl takes it.
  std::string_view impl_name() const { return qualified().substr(qualified().find("::") + 2); }
  // "aten.add.Tensor", "fsdp.chunk_cat": the name stats count the op under
  // (str(OpOverload), without ".default").
  std::string counted() const { return std::string(ns()) + "." + std::string(impl_name()); }
};

inline constexpr OwnedOp kOwnedOps[] = {
#define NPU_DISPATCH_STOCK_OP(id, kernel, wrapper, copy, schema) {schema, #wrapper, true},
#define NPU_DISPATCH_LIBRARY_OP(id, kernel, wrapper, copy, schema) {schema, #wrapper, false},
#include "dispatch/owned_ops.h"
#undef NPU_DISPATCH_STOCK_OP
#undef NPU_DISPATCH_LIBRARY_OP
};
static_assert(sizeof(kOwnedOps) / sizeof(kOwnedOps[0]) == kNumCountedOps, "a row per counted op");

// The row of the op `qualified` ("aten::add.Tensor", "fsdp::chunk_cat"), if owned.
inline std::optional<CountedOp> owned_op(std::string_view qualified) {
  for (int k = 0; k < kNumCountedOps; ++k) {
    if (kOwnedOps[k].qualified() == qualified) return static_cast<CountedOp>(k);
  }
  return std::nullopt;
}

}  // namespace npu_dispatch
