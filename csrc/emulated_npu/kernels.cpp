// The emulated device's ATen kernels: the core ones a backend must bring (allocation, views,
// copies, set_, resize), a no-op record_stream, and a boxed fallback that runs every other op with
// ATen's CPU kernels (at::native::cpu_fallback, as PyTorch's OpenReg backend does). Each kernel
// counts one device launch of its kind; what it runs on the host meanwhile counts none.
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/_neg_view.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/copy_native.h>
#include <c10/core/Allocator.h>
#include <torch/library.h>

#include "state.h"

namespace npu_dispatch::emulated_npu {

// A CPU tensor over the same host memory (zero-copy), with the tensor's lazy conjugate and negative
// bits: what a device kernel computes on.
at::Tensor host_view(const at::Tensor& t) {
  void* p = t.numel() == 0 ? nullptr : const_cast<void*>(t.const_data_ptr());
  at::Tensor h = p == nullptr ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU))
                              : at::from_blob(p, t.sizes(), t.strides(), t.options().device(at::kCPU));
  if (t.is_conj()) h = h.conj();
  if (t.is_neg()) h = at::_neg_view(h);
  return h;
}

at::Tensor host_or_self(const at::Tensor& t) { return t.is_cpu() ? t : host_view(t); }

namespace {

constexpr c10::DispatchKeySet kNpuKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "the emulated npu has strided tensors only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, c10::GetAllocator(c10::DeviceType::PrivateUse1), kNpuKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "the emulated npu has strided tensors only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, c10::GetAllocator(c10::DeviceType::PrivateUse1), kNpuKeys,
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(offset));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size, std::optional<at::MemoryFormat> fmt) {
  const c10::DeviceGuard guard(self.device());  // a grown storage stays on its device
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), fmt);
}

// Every copy that reaches the device: one launch (an H2D / D2H transfer or a D2D copy kernel).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  count_launch("copy");
  LaunchScope scope;
  auto d = host_or_self(dst);
  d.copy_(host_or_self(self), non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source) { return at::native::set_(self, source); }

at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
                               c10::SymIntArrayRef stride) {
  return at::native::set_storage_cpu_(self, source, offset.expect_int(), C10_AS_INTARRAYREF_SLOW(size),
                                      C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) { return at::native::set_tensor_(self, source); }

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, c10::GetAllocator(c10::DeviceType::PrivateUse1), true);
  return at::native::set_storage_cpu_(self, empty, 0, {0}, {});
}

void record_stream(at::Tensor&, c10::Stream) {}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  count_launch(op.schema().name());
  LaunchScope scope;
  at::native::cpu_fallback(op, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  // Views the CPU fallback cannot give (its results would be copies): ATen's strided ones.
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("resize_", resize_);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
  m.impl("record_stream", record_stream);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

// A copy from or into a lazily conjugated or negated npu tensor reaches _copy_from with its bits
// (host_view carries them): the Conjugate / Negative fallbacks would materialize through copy_,
// which comes back here, without end.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }

}  // namespace npu_dispatch::emulated_npu
