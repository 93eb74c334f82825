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

void set_capabilities(const std::vector<std::pair<std::string, std::optional<Capability>>>& entries) {
  auto fresh = std::make_shared<CapabilityTable>();
  for (const auto& [name, cap] : entries) {
    c10::DeviceType type;
    if (!parse_device_type(name, &type)) continue;
    auto& slot = fresh->entries[static_cast<int>(type)];
    slot = cap.value_or(Capability());
    slot.present = cap.has_value();
  }
  std::lock_guard<std::mutex> g(table_mutex());
  table_slot() = std::move(fresh);
}

}  // namespace npu_dispatch
