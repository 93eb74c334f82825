// The emulated Ascend device, registered as PrivateUse1 (renamed "npu" from Python, as torch_npu
// does): host memory behind an npu DataPtr, a device guard with synchronous stand-in streams and
// events, and the PrivateUse1 hooks FSDP2 needs (storage resize). Follows the shape of PyTorch's
// OpenReg test backend (test/cpp_extensions/open_registration_extension).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>

#include "state.h"

namespace npu_dispatch::emulated_npu {
namespace {

using c10::DeviceType;

void free_host(void* p) { c10::free_cpu(p); }

struct HostAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = n == 0 ? nullptr : c10::alloc_cpu(n);
    return {p, p, &free_host, c10::Device(DeviceType::PrivateUse1, current_device())};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_host; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

HostAllocator g_allocator;

// Streams are ids only: every kernel runs synchronously on the host, so any order of streams is
// already the program order (what an emulated device cannot show: docs/design.md).
thread_local std::array<c10::StreamId, kDeviceCount> t_stream{};
std::atomic<c10::StreamId> g_next_stream{1};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Guard final : c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {DeviceType::PrivateUse1, current_device()}; }
  void setDevice(c10::Device d) const override {
    if (d.index() >= 0) set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < kDeviceCount) {
      try {
        set_current_device(d.index());
      } catch (...) {
      }
    }
  }
  static c10::DeviceIndex index_of(c10::Device d) {
    const auto i = d.index() < 0 ? current_device() : d.index();
    return i < kDeviceCount ? i : current_device();
  }
  c10::Stream getStream(c10::Device d) const noexcept override {
    const auto i = index_of(d);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(DeviceType::PrivateUse1, i), t_stream[i]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    const auto i = d.index() < 0 ? current_device() : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(DeviceType::PrivateUse1, i), 0);
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    const auto i = d.index() < 0 ? current_device() : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(DeviceType::PrivateUse1, i), g_next_stream++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    const auto old = getStream(s.device());
    t_stream[index_of(s.device())] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDeviceCount; }
  // An event is the host time it was recorded at (elapsed_time works; every wait is already met).
  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (*event == nullptr) *event = new double(0);
    *static_cast<double*>(*event) = now_ms();
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<double*>(event);
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "Both events must be recorded before calculating elapsed time.");
    return *static_cast<double*>(end) - *static_cast<double*>(start);
  }
};

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return kDeviceCount; }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    const auto old = current_device();
    set_current_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  // Random numbers come from the CPU generator: the emulated device has none of its own.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Device getDeviceFromPtr(void*) const override { return {DeviceType::PrivateUse1, current_device()}; }
  // FSDP2 frees and re-allocates unsharded parameters with untyped_storage().resize_().
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    const c10::DeviceGuard guard(storage.device());  // the new memory on the storage's device
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    c10::DataPtr fresh = g_allocator.allocate(newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0) std::memcpy(fresh.get(), impl->data(), keep);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

void register_device() {
  static bool done = [] {
    c10::SetAllocator(DeviceType::PrivateUse1, &g_allocator);
    at::RegisterPrivateUse1HooksInterface(new Hooks());
    return true;
  }();
  (void)done;
}

}  // namespace npu_dispatch::emulated_npu
