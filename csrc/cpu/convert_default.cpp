// The DEFAULT capability: ATen compiles it with the baseline ISA, and so do we.
#define CPU_CAPABILITY npu_dispatch_default
#define NPU_DISPATCH_VARIANT_NAME "DEFAULT"
#include "cpu/convert_prelude.h"
#include "cpu/convert_impl.h"

namespace npu_dispatch {
const ConvertFns* convert_fns_default() {
  return npu_dispatch_default::fns();
}
}  // namespace npu_dispatch
