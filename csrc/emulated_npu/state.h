// The emulated Ascend device's process state: its current device and stream per thread, its CANN
// version, and the launch counts the model of op-plugin's kernels keeps (state.cpp).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <string>

namespace npu_dispatch::emulated_npu {

constexpr c10::DeviceIndex kDeviceCount = 8;  // one Ascend node: npu:0 .. npu:7

c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);

// CANN version as (major, minor, stage): "8.1.RC1" -> (8, 1, 1), "9.1.0" -> (9, 1, 1000), as
// npu_dispatch/capabilities.py parses it.
struct CannVersion {
  int major = 0, minor = 0, stage = 0;
  bool at_least(int ma, int mi, int st) const {
    if (major != ma) return major > ma;
    if (minor != mi) return minor > mi;
    return stage >= st;
  }
};
CannVersion cann();
void set_cann(int major, int minor, int stage);

// One device launch of `kind` (an aclnn operator, a runtime call, or an ATen op run by the CPU
// fallback). Launches made while a kernel runs its own CPU work are not counted (LaunchScope).
void count_launch(const std::string& kind, int64_t n = 1);
std::map<std::string, int64_t> launches();
void reset_launches();

// Inside a device kernel: the CPU work it runs on host views issues no further launches.
struct LaunchScope {
  LaunchScope();
  ~LaunchScope();
};

}  // namespace npu_dispatch::emulated_npu
