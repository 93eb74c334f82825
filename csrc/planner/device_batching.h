// What a device's own _foreach_copy_ does with a whole list, where its capability says that op
// batches lists itself (Capability::batched_keeps_versions: Ascend op-plugin,
// op_plugin/ops/opapi/ForeachCopyKernelOpApi.cpp). op-plugin takes a list whole when its sources
// share one dtype, else one source-dtype group at a time, and sends each group to
//   - its batched kernel (aclnnForeachCopy) where ATen's fast route holds for a (src, dst) pair
//     the capability supports: no version counter moves;
//   - one batched memcpy where the group is a uniform host <-> device transfer
//     (batched_transfers; with non_blocking, on the current device only): none moves;
//   - else one copy_ per pair, each moving its destination's counter.
// The planner reads this to hand such transfer groups to the device op as they are, to bump only
// the counters stock moves, and to count a whole-stock call's launches as the device issues them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "planner/capability_table.h"

namespace npu_dispatch {

enum class DeviceBatch : int8_t { Batched, Transfer, PerTensor };

struct DeviceBatching {
  const Capability* cap = nullptr;  // nullptr: no device of the list batches lists itself
  std::vector<DeviceBatch> of_pair;  // per pair
  std::vector<std::vector<int64_t>> groups;  // source-dtype groups, in first-appearance order
  std::vector<DeviceBatch> of_group;
  int64_t launches = 0;  // what the device op issues for the whole list
};

// Launches the device's own op issues for a group of `n` pairs it sends as `batch`.
inline int64_t batch_launches(DeviceBatch batch, int64_t n, const Capability& cap) {
  return batch == DeviceBatch::Batched ? cap.launches(n) : batch == DeviceBatch::Transfer ? 1 : n;
}

// Lists must be non-empty and of equal length.
DeviceBatching device_batching(at::TensorList dsts, at::TensorList srcs, bool non_blocking, const CapabilityTable& caps);

// The capability of the first non-CPU tensor (destinations, then sources) whose device batches
// lists itself, else nullptr.
const Capability* own_op_capability(at::TensorList dsts, at::TensorList srcs, const CapabilityTable& caps);

}  // namespace npu_dispatch
