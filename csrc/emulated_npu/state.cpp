#include "state.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>

namespace npu_dispatch::emulated_npu {
namespace {

thread_local c10::DeviceIndex t_device = 0;
thread_local int t_kernel_depth = 0;
std::atomic<int> g_cann_major{8}, g_cann_minor{0}, g_cann_stage{3};
std::mutex g_mu;
std::map<std::string, int64_t> g_launches;

}  // namespace

c10::DeviceIndex current_device() { return t_device; }

void set_current_device(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kDeviceCount, "npu device index ", static_cast<int>(index),
              " out of range: the emulated device has ", static_cast<int>(kDeviceCount), " devices");
  t_device = index;
}

CannVersion cann() { return {g_cann_major.load(), g_cann_minor.load(), g_cann_stage.load()}; }

void set_cann(int major, int minor, int stage) {
  g_cann_major = major;
  g_cann_minor = minor;
  g_cann_stage = stage;
}

void count_launch(const std::string& kind, int64_t n) {
  if (t_kernel_depth > 0 || n == 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_launches[kind] += n;
}

std::map<std::string, int64_t> launches() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_launches;
}

void reset_launches() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_launches.clear();
}

LaunchScope::LaunchScope() { ++t_kernel_depth; }
LaunchScope::~LaunchScope() { --t_kernel_depth; }

}  // namespace npu_dispatch::emulated_npu
