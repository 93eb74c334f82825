// A model of Ascend op-plugin's `_foreach_copy_` for the emulated device: which launches the real
// kernel issues for a list, and the same results.
//
// Modelled on op-plugin `op_plugin/ops/opapi/ForeachCopyKernelOpApi.cpp` at commit 0f8373b0
// (github.com/Ascend/op-plugin), the version after Ascend/pytorch merge request 34632:
//   - a list whose sources have one dtype is processed whole; otherwise it is grouped by SOURCE
//     dtype only (destination dtypes play no part in the grouping);
//   - per group: `aclnnForeachCopy`, at most 48 tensors a launch (SINGLE_FOREACH_OP_TENSOR_COUNT),
//     issued asynchronously whatever `non_blocking` says, when ATen's can_use_fast_route holds and
//     src[0]'s dtype is in the kernel's list (int32, int16, int8, uint8, bf16, fp32, fp16; int64,
//     fp64 and bool from CANN 8.1.RC1);
//   - else one `memcpyBatch` runtime call for a uniform host->device or device->host list (raw
//     bytes: it reads neither strides nor dtypes);
//   - else op-plugin's slow path, one `copy_` (one launch) per tensor.
//   - From CANN 9.1 the kernel also converts fp32->fp16, fp32->bf16, fp16->fp32 and bf16->fp32
//     (the rule npu_dispatch/capabilities.py records; no stored op-plugin version shows it): a group
//     with one such (src, dst) pair and otherwise fast-route-shaped tensors takes the batched launch.
// The SoC is taken to support both the ND output and memcpyBatch (Ascend 910B).
#include <ATen/native/ForeachUtils.h>
#include <ATen/ops/from_blob.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "state.h"

namespace npu_dispatch::emulated_npu {

at::Tensor host_or_self(const at::Tensor& t);

namespace {

constexpr size_t kTensorsPerLaunch = 48;

bool dtype_listed(c10::ScalarType t) {
  switch (t) {
    case at::kInt: case at::kShort: case at::kChar: case at::kByte:
    case at::kBFloat16: case at::kFloat: case at::kHalf:
      return true;
    case at::kLong: case at::kDouble: case at::kBool:
      return cann().at_least(8, 1, 1);
    default:
      return false;
  }
}

bool cross_pair(c10::ScalarType s, c10::ScalarType d) {
  if (!cann().at_least(9, 1, 1000)) return false;
  return (s == at::kFloat && (d == at::kHalf || d == at::kBFloat16)) ||
         ((s == at::kHalf || s == at::kBFloat16) && d == at::kFloat);
}

// ATen's fast route with the cross-list dtype check left out, and one (src, dst) pair throughout.
bool cross_dtype_batch(at::TensorList self, at::TensorList src) {
  const auto sd = src[0].scalar_type(), dd = self[0].scalar_type();
  if (sd == dd || !cross_pair(sd, dd)) return false;
  return at::native::check_fast_path_restrictions({self, src}, {}, false, /*skip_cross_list_dtype_check=*/true);
}

bool fast_route(at::TensorList self, at::TensorList src) {
  return (at::native::can_use_fast_route(self, src) && dtype_listed(src[0].scalar_type())) ||
         cross_dtype_batch(self, src);
}

// op-plugin's check_tensor_device_dtype_base: one device (type and index) per list, the two lists
// on different sides (never device to device); non_blocking also needs the current device.
bool uniform_transfer(at::TensorList self, at::TensorList src, bool non_blocking) {
  auto one_device = [&](at::TensorList l) {
    for (const auto& t : l) {
      if (t.device() != l[0].device()) return false;
      if (non_blocking && t.device().is_privateuseone() && t.device().index() != current_device()) return false;
    }
    return true;
  };
  return one_device(self) && one_device(src) && self[0].device().type() != src[0].device().type();
}

void process(at::TensorList self, at::TensorList src, bool non_blocking) {
  const size_t n = self.size();
  if (fast_route(self, src)) {
    count_launch("aclnnForeachCopy", static_cast<int64_t>((n + kTensorsPerLaunch - 1) / kTensorsPerLaunch));
    LaunchScope scope;
    for (size_t i = 0; i < n; ++i) {
      auto d = host_or_self(self[i]);
      d.copy_(host_or_self(src[i]));
    }
    return;
  }
  if (uniform_transfer(self, src, non_blocking)) {
    count_launch("memcpyBatch");
    for (size_t i = 0; i < n; ++i) {
      const size_t dst_len = self[i].numel() * self[i].element_size();
      const size_t src_len = src[i].numel() * src[i].element_size();
      const size_t len = std::min(dst_len, src_len);
      if (len > 0) std::memcpy(self[i].data_ptr(), src[i].const_data_ptr(), len);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    auto d = self[i];
    d.copy_(src[i], non_blocking);
  }
}

void foreach_copy_(at::TensorList self, at::TensorList src, bool non_blocking) {
  at::native::check_foreach_api_restrictions(self, src);
  bool uniform = true;
  for (const auto& s : src) uniform = uniform && s.scalar_type() == src[0].scalar_type();
  if (uniform) {
    process(self, src, non_blocking);
    return;
  }
  // Groups by source dtype, here in order of first appearance (op-plugin's unordered_map has none).
  std::vector<c10::ScalarType> keys;
  std::vector<std::vector<at::Tensor>> dsts, srcs;
  for (size_t i = 0; i < src.size(); ++i) {
    const auto k = src[i].scalar_type();
    size_t g = 0;
    while (g < keys.size() && keys[g] != k) ++g;
    if (g == keys.size()) {
      keys.push_back(k);
      dsts.emplace_back();
      srcs.emplace_back();
    }
    dsts[g].push_back(self[i]);
    srcs[g].push_back(src[i]);
  }
  for (size_t g = 0; g < keys.size(); ++g) process(dsts[g], srcs[g], non_blocking);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("_foreach_copy_", foreach_copy_); }

}  // namespace npu_dispatch::emulated_npu
