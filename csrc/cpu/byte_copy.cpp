#include "cpu/byte_copy.h"
#include "planner/tuning.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define NPU_DISPATCH_COPY_X86 1
#endif

namespace npu_dispatch {

#ifdef NPU_DISPATCH_COPY_X86
// In the AVX2 namespace, the only one whose functions may use 256-bit registers (the library is
// checked for that by tests/test_native.py); the function alone is compiled for AVX2.
namespace npu_dispatch_avx2 {
namespace {

// Head bytes up to the cache-line alignment of `dst` and the tail go through memcpy, so that
// every streamed line is written whole (a partly streamed line costs a partial write-combining
// flush); the body through four 32-byte streaming stores per loop (two whole lines).
__attribute__((target("avx2"))) void stream(char* dst, const char* src, int64_t n) {
  const int64_t head = std::min<int64_t>(n, (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  const int64_t body = n & ~int64_t{127};
  for (int64_t i = 0; i < body; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  std::memcpy(dst + body, src + body, n - body);
}

__attribute__((target("avx2"))) void copy(char* dst, const char* src, int64_t n) {
  using V = __m256i;
  const V first = _mm256_loadu_si256(reinterpret_cast<const V*>(src));
  const V last = _mm256_loadu_si256(reinterpret_cast<const V*>(src + n - 32));
  _mm256_storeu_si256(reinterpret_cast<V*>(dst), first);
  // From the first 32-byte boundary of dst past its start: every store below is aligned.
  int64_t i = 32 - static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst) & 31);
  for (; i + 32 <= n; i += 32) {
    _mm256_store_si256(reinterpret_cast<V*>(dst + i), _mm256_loadu_si256(reinterpret_cast<const V*>(src + i)));
  }
  _mm256_storeu_si256(reinterpret_cast<V*>(dst + n - 32), last);
}

}  // namespace
}  // namespace npu_dispatch_avx2
#endif

namespace {

// "32768K" and the like (sysfs cache sizes); -1 where unreadable.
int64_t parse_size(const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || v <= 0) return -1;
  const char unit = *end;
  return unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : unit == 'G' ? v << 30 : v;
}

// CPU 0's level-3 (or higher) cache as sysfs lists it: the cache its copies actually share
// (sysconf's level-3 figure can be the whole package's, several times what the cores share). A
// host listing none gets 32 MB rather than its L2's size, below which calls that fit
// in an unlisted L3 would stream. Threads spread over several such caches (multi-CCX or
// multi-socket hosts) share more than this; calls between the two sizes then stream too.
int64_t last_level_cache_bytes() {
  int best_level = 2;
  int64_t best = -1;
  for (int k = 0; k < 16; ++k) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(k) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int level = 0;
    std::string size;
    if (!(level_file >> level) || !(size_file >> size)) continue;
    const int64_t bytes = parse_size(size);
    if (bytes > 0 && level > best_level) {
      best_level = level;
      best = bytes;
    }
  }
  return best > 0 ? best : int64_t{32} << 20;
}

// Whether this CPU runs the AVX2 loops.
bool stream_supported() {
#ifdef NPU_DISPATCH_COPY_X86
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

}  // namespace

int64_t stream_moved_bytes() {
  static const int64_t bytes = stream_supported() ? std::min(last_level_cache_bytes(), kMaxStreamMovedBytes)
                                                  : std::numeric_limits<int64_t>::max();
  return bytes;
}

void byte_copy(char* dst, const char* src, int64_t n) {
#ifdef NPU_DISPATCH_COPY_X86
  if (stream_supported() && n >= 32) {
    npu_dispatch_avx2::copy(dst, src, n);
    return;
  }
#endif
  std::memcpy(dst, src, static_cast<size_t>(n));
}

void stream_copy(char* dst, const char* src, int64_t n) {
#ifdef NPU_DISPATCH_COPY_X86
  if (stream_supported()) {
    npu_dispatch_avx2::stream(dst, src, n);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

void stream_fence() {
#ifdef NPU_DISPATCH_COPY_X86
  _mm_sfence();
#endif
}

}  // namespace npu_dispatch
