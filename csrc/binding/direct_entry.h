// The hand-written CPython entries of the measured hot path (binding/direct_entry.cpp).
#pragma once

#include <torch/extension.h>

namespace npu_dispatch::binding {

// Adds foreach_copy_direct, copy_out_direct and chunk_cat_direct to `m`.
void add_direct_entries(pybind11::module_& m);

}  // namespace npu_dispatch::binding
