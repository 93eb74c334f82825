#include "planner/capability_table.h"

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <mutex>

namespace npu_dispatch {
namespace {

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}

std::shared_ptr<const CapabilityTable>& table_slot() {
  // Empty until Python pushes: every device type plans as "no_capability" (stock), the safe side.
  static std::shared_ptr<const CapabilityTable> t = std::make_shared<CapabilityTable>();
  return t;
}

bool parse_device_type(const std::string& name, c10::DeviceType* out) {
  try {
    *out = c10::Device(name).type();
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

}  // namespace

std::shared_ptr<const CapabilityTable> current_capabilities() {
  std::lock_guard<std::mutex> g(table_mutex());
  return table_slot();
}

void set_capabilities(
    const std::vector<std::string>& device_types,
    const std::vector<int64_t>& table,
    const std::vector<c10::ScalarType>& dtypes) {
  auto fresh = std::make_shared<CapabilityTable>();
  size_t pos = 0;
  auto next = [&]() {
    TORCH_CHECK(pos < table.size(), "npu_dispatch: truncated capability table");
    return table[pos++];
  };
  auto dtype_at = [&](int64_t k) {
    TORCH_CHECK(k >= 0 && k < static_cast<int64_t>(dtypes.size()), "npu_dispatch: bad dtype index");
    return static_cast<int>(dtypes[k]);
  };
  for (const auto& name : device_types) {
    Capability cap;
    const int64_t flags = next();
    cap.present = (flags & kCapPresent) != 0;
    cap.whole_list = (flags & kCapWholeListOnly) != 0;
    cap.host_pass = (flags & kCapHostPass) != 0;
    cap.batched_transfers = (flags & kCapBatchedTransfers) != 0;
    cap.batched_keeps_versions = (flags & kCapBatchedKeepsVersions) != 0;
    cap.max_per_launch = next();
    cap.stage_bytes = next();
    const int64_t n_pairs = next();
    for (int64_t k = 0; k < n_pairs; ++k) {
      const int s = dtype_at(next());
      const int d = dtype_at(next());
      cap.pairs.set(s * kNumDtypes + d);
    }
    c10::DeviceType type;
    if (parse_device_type(name, &type)) {
      fresh->entries[static_cast<int>(type)] = cap;
    }
  }
  TORCH_CHECK(pos == table.size(), "npu_dispatch: trailing data in capability table");
  std::lock_guard<std::mutex> g(table_mutex());
  table_slot() = std::move(fresh);
}

}  // namespace npu_dispatch
