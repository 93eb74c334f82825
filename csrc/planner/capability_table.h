// The capability table in force, as pushed from Python (npu_dispatch/capabilities.py stays the
// source of truth; overrides push a new snapshot on enter and exit).
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <bitset>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace npu_dispatch {

constexpr int kNumDtypes = static_cast<int>(c10::ScalarType::NumOptions);
constexpr int kNumDeviceTypes = static_cast<int>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES);

struct Capability {
  bool present = false;  // false: the device type has no fast path ("no_capability")
  // Exact only where stock's op itself uses the kernel, on a whole list (capabilities.py).
  bool whole_list = false;
  bool host_pass = false;  // a host pass that copies the coalesced runs too: keep every run
  // The device's _foreach_copy_ sends a uniform host<->device list as one batched memcpy.
  bool batched_transfers = false;
  // The device's batched kernels move no version counter (op-plugin calls no increment_version
  // there); its per-tensor copies moves each destination's once, through copy_.
  bool batched_keeps_versions = false;
  int64_t max_per_launch = 0;  // 0: one launch per tensor (a host loop)
  // Scratch bytes one staged chunk may allocate (planner/plan.h, Stage); 0: never stage.
  int64_t stage_bytes = 0;
  std::bitset<kNumDtypes * kNumDtypes> pairs;  // (src, dst); same-dtype copies on the diagonal

  bool supports(c10::ScalarType src, c10::ScalarType dst) const {
    return pairs[static_cast<int>(src) * kNumDtypes + static_cast<int>(dst)];
  }
  int64_t launches(int64_t n) const {
    return max_per_launch == 0 ? n : (n + max_per_launch - 1) / max_per_launch;
  }
};

// Whether the library's CPU kernel (cpu/copy_kernel.h, fsdp/'s passes) copies a call's pairs on
// this device: a host pass, on the CPU, that is not whole_list_only (exact only where stock's op
// runs the kernel on the whole list). Elsewhere the device's own kernels do.
inline bool cpu_kernel_serves(c10::DeviceType type, const Capability* cap) {
  return type == c10::DeviceType::CPU && cap != nullptr && cap->host_pass && !cap->whole_list;
}

struct CapabilityTable {
  std::array<Capability, kNumDeviceTypes> entries{};
  const Capability* get(c10::DeviceType t) const {
    const auto& c = entries[static_cast<int>(t)];
    return c.present ? &c : nullptr;
  }
};

// A snapshot, so one call plans against one consistent table even if Python pushes meanwhile.
std::shared_ptr<const CapabilityTable> current_capabilities();

// The table in force, pushed from Python (npu_dispatch/_native.py push_capabilities) as one
// entry per device type name (nullopt: no fast path). Names this build cannot parse into a
// DeviceType (an unregistered "npu") are skipped.
void set_capabilities(const std::vector<std::pair<std::string, std::optional<Capability>>>& entries);

}  // namespace npu_dispatch
