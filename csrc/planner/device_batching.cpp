#include "planner/device_batching.h"

#include <ATen/native/ForeachUtils.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>

namespace npu_dispatch {
namespace {

bool one_device(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    if (t.device() != ts[0].device()) return false;
  }
  return true;
}

DeviceBatch batch_of(const std::vector<at::Tensor>& d, const std::vector<at::Tensor>& s, bool non_blocking,
                     const Capability& cap) {
  const auto st = s[0].scalar_type(), dt = d[0].scalar_type();
  bool one_pair = true;
  for (const auto& t : d) one_pair = one_pair && t.defined() && t.scalar_type() == dt;
  if (one_pair && cap.supports(st, dt) &&
      at::native::check_fast_path_restrictions({d, s}, {}, false, /*skip_cross_list_dtype_check=*/st != dt)) {
    return DeviceBatch::Batched;
  }
  if (!cap.batched_transfers || !one_device(d) || !one_device(s) || d[0].device().type() == s[0].device().type()) {
    return DeviceBatch::PerTensor;
  }
  if (non_blocking) {
    // op-plugin: an asynchronous batched memcpy only from or to the current device.
    for (const auto* side : {&d[0], &s[0]}) {
      const auto dev = side->device();
      if (dev.is_cpu()) continue;
      if (c10::impl::VirtualGuardImpl(dev.type()).getDevice().index() != dev.index()) return DeviceBatch::PerTensor;
    }
  }
  return DeviceBatch::Transfer;
}

}  // namespace

const Capability* own_op_capability(at::TensorList dsts, at::TensorList srcs, const CapabilityTable& caps) {
  for (const auto list : {dsts, srcs}) {
    for (const auto& t : list) {
      if (!t.defined() || t.is_cpu()) continue;
      const Capability* c = caps.get(t.device().type());
      if (c != nullptr && c->batched_keeps_versions) return c;
    }
  }
  return nullptr;
}

DeviceBatching device_batching(at::TensorList dsts, at::TensorList srcs, bool non_blocking, const CapabilityTable& caps) {
  DeviceBatching r;
  r.cap = own_op_capability(dsts, srcs, caps);
  if (r.cap == nullptr) return r;
  std::vector<c10::ScalarType> keys;
  for (size_t i = 0; i < srcs.size(); ++i) {
    const auto k = srcs[i].scalar_type();
    const size_t g = std::find(keys.begin(), keys.end(), k) - keys.begin();
    if (g == keys.size()) {
      keys.push_back(k);
      r.groups.emplace_back();
    }
    r.groups[g].push_back(static_cast<int64_t>(i));
  }
  r.of_pair.assign(dsts.size(), DeviceBatch::PerTensor);
  for (const auto& g : r.groups) {
    std::vector<at::Tensor> d, s;
    d.reserve(g.size());
    s.reserve(g.size());
    for (const int64_t i : g) {
      d.push_back(dsts[i]);
      s.push_back(srcs[i]);
    }
    const DeviceBatch batch = batch_of(d, s, non_blocking, *r.cap);
    r.of_group.push_back(batch);
    for (const int64_t i : g) r.of_pair[i] = batch;
    const auto n = static_cast<int64_t>(g.size());
    r.launches += batch_launches(batch, n, *r.cap);
  }
  return r;
}

}  // namespace npu_dispatch
