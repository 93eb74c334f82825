// Python entry of the emulated Ascend device (npu_dispatch/testing/emulated_npu.py wraps it).
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/extension.h>

#include "state.h"

namespace npu_dispatch::emulated_npu {
void register_device();
c10::intrusive_ptr<c10d::Backend> make_hccl(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size);
}  // namespace npu_dispatch::emulated_npu

namespace emu = npu_dispatch::emulated_npu;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_device", &emu::register_device);
  m.def("device_count", [] { return static_cast<int>(emu::kDeviceCount); });
  m.def("current_device", [] { return static_cast<int>(emu::current_device()); });
  m.def("set_device", [](int i) { emu::set_current_device(static_cast<c10::DeviceIndex>(i)); });
  m.def("set_cann", &emu::set_cann);
  m.def("launches", [] { return emu::launches(); });
  m.def("reset_launches", &emu::reset_launches);
  m.def("make_hccl", &emu::make_hccl);
}
