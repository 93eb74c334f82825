// Everything the vec headers pull in that is not per-capability (sleef.h excepted: it declares
// its vector functions only once the ISA macros are on, and defines nothing inline), included BEFORE a TU switches
// on AVX2/AVX-512 codegen: inline functions defined after the switch would be compiled for that
// ISA, and the linker may keep that copy for callers on CPUs without it.
#pragma once

#include <ATen/AccumulateType.h>
#include <ATen/NumericUtils.h>
#include <ATen/native/Math.h>
#include <ATen/native/cpu/zmath.h>
#include <ATen/native/quantized/AffineQuantizerBase.h>
#include <c10/macros/Macros.h>
#include "fsdp/chunk_cat_layout.h"
#include "cpu/convert.h"
#include <c10/util/BFloat16-math.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/Load.h>
#include <c10/util/TypeCast.h>
#include <c10/util/complex.h>
#include <c10/util/copysign.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <x86intrin.h>
#endif
