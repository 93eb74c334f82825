// The owned ops as C++ sees them: the rows of dispatch/owned_ops.h, expanded once here. Counting,
// stats, the dispatcher facts, the interception's install and the boundary's names all read this.
#pragma once

#include <optional>
#include <string>
#include <string_view>

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

struct OwnedOp {
  const char* schema;   // "fsdp::chunk_cat(Tensor[] tensors, ...) -> ()"
  const char* wrapper;  // npu_dispatch/engine.py's serving function
  bool intercepted;     // a stock op, served at BackendSelect (else the library's own op)

  // "fsdp::chunk_cat": the schema's qualified name.
  std::string_view name() const {
    const std::string_view s(schema);
    return s.substr(0, s.find('('));
  }
  // "fsdp": the namespace.
  std::string_view ns() const { return name().substr(0, name().find("::")); }
  // "chunk_cat": the name without its namespace.
  std::string_view short_name() const { return name().substr(name().find("::") + 2); }
  // "fsdp.chunk_cat": the name stats count the op under.
  std::string counted() const { return std::string(ns()) + "." + std::string(short_name()); }
};

inline constexpr OwnedOp kOwnedOps[] = {
#define NPU_DISPATCH_STOCK_OP(id, kernel, wrapper, copy, schema) {schema, #wrapper, true},
#define NPU_DISPATCH_LIBRARY_OP(id, kernel, wrapper, copy, schema) {schema, #wrapper, false},
#include "dispatch/owned_ops.h"
#undef NPU_DISPATCH_STOCK_OP
#undef NPU_DISPATCH_LIBRARY_OP
};
static_assert(sizeof(kOwnedOps) / sizeof(kOwnedOps[0]) == kNumCountedOps, "a row per counted op");

// The row of the op named `name` ("fsdp::chunk_cat"), if it is owned.
inline std::optional<CountedOp> owned_op(std::string_view name) {
  for (int k = 0; k < kNumCountedOps; ++k) {
    if (kOwnedOps[k].name() == name) return static_cast<CountedOp>(k);
  }
  return std::nullopt;
}

}  // namespace npu_dispatch
