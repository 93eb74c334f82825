#include "cpu/byte_pass.h"

namespace npu_dispatch {
namespace {

std::atomic<int64_t> g_passes{0}, g_items{0}, g_bytes{0}, g_streamed{0};

}  // namespace

void count_pass(int64_t items, int64_t bytes, int64_t streamed) {
  if (streamed > 0) g_streamed.fetch_add(streamed, std::memory_order_relaxed);
  g_passes.fetch_add(1, std::memory_order_relaxed);
  g_items.fetch_add(items, std::memory_order_relaxed);
  g_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

KernelCounters kernel_counters() {
  return {g_passes.load(), g_items.load(), g_bytes.load(), g_streamed.load()};
}

}  // namespace npu_dispatch
