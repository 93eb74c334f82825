// Byte copies of separate buffers far beyond the cache, three ways: the kernel's 64 KB memcpy
// chunks, an AVX2 streaming-store loop (as csrc/cpu/byte_copy.cpp), and glibc's memcpy of whole
// items (its own streaming path above its threshold). No torch: it checks that streaming stores
// still win beyond the cache (csrc/cpu/byte_copy.h).
//
//   g++ -O2 -fopenmp benchmarks/stream_stores.cpp -o /tmp/stream_stores
//   OMP_NUM_THREADS=2 /tmp/stream_stores 65536 67108864    # item bytes, source bytes in all
//
// Prints the median of 40 passes for each way (items split evenly across the OpenMP threads).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

__attribute__((target("avx2"))) static void stream(char* d, const char* s, size_t n) {
  size_t head = std::min(n, (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const size_t body = n & ~size_t{127};
  for (size_t i = 0; i < body; i += 128) {
    for (size_t k = 0; k < 128; k += 32) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + k),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + k)));
    }
  }
  std::memcpy(d + body, s + body, n - body);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ITEM_BYTES SOURCE_BYTES\n", argv[0]);
    return 2;
  }
  const size_t item = std::strtoull(argv[1], nullptr, 10), total = std::strtoull(argv[2], nullptr, 10);
  const size_t items = std::max<size_t>(total / item, 1);
  std::vector<char*> src(items), dst(items);
  for (size_t i = 0; i < items; ++i) {
    src[i] = static_cast<char*>(std::aligned_alloc(64, (item + 63) / 64 * 64));
    dst[i] = static_cast<char*>(std::aligned_alloc(64, (item + 63) / 64 * 64));
    std::memset(src[i], static_cast<int>(i), item);
    std::memset(dst[i], 0, item);
  }
  const char* names[] = {"64 KB memcpy chunks", "AVX2 streaming loop", "memcpy of whole items"};
  for (int way = 0; way < 3; ++way) {
    std::vector<double> us;
    for (int rep = 0; rep < 40; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < items; ++i) {
        if (way == 1) {
          stream(dst[i], src[i], item);
        } else if (way == 2) {
          std::memcpy(dst[i], src[i], item);
        } else {
          for (size_t o = 0; o < item; o += 65536) std::memcpy(dst[i] + o, src[i] + o, std::min<size_t>(65536, item - o));
        }
      }
      _mm_sfence();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    std::printf("%zu x %zu B, %-22s median %8.0f us\n", items, item, names[way], us[us.size() / 2]);
  }
  return 0;
}
