#include "native_stats.h"

#include <mutex>

#include "execute.h"

namespace npu_dispatch {
namespace {

constexpr int kOpFields = 4;
constexpr int kLen = kNumDirectOps * kOpFields + kNumPaths * 4 + kNumKinds;

std::mutex g_mutex;
std::vector<int64_t> g_acc(kLen, 0);

}  // namespace

void record_direct(DirectOp op, const std::vector<int64_t>& v, int64_t nanoseconds) {
  std::lock_guard<std::mutex> g(g_mutex);
  int64_t* o = g_acc.data() + op * kOpFields;
  o[0] += 1;
  const auto used = [&](Path p) { return v[path_slot(p, 0)] != 0; };
  o[1] += (used(kCoalesced) || used(kForeach)) ? 1 : 0;
  o[2] += (used(kFallback) || used(kStock)) ? 1 : 0;
  o[3] += nanoseconds;
  int64_t* paths = g_acc.data() + kNumDirectOps * kOpFields;
  for (int p = 0; p < kNumPaths; ++p) {
    if (!used(static_cast<Path>(p))) continue;
    paths[4 * p] += 1;
    for (int f = 0; f < 3; ++f) paths[4 * p + 1 + f] += v[path_slot(static_cast<Path>(p), f)];
  }
  int64_t* reasons = paths + kNumPaths * 4;
  for (int k = 0; k < kNumKinds; ++k) reasons[k] += v[reason_slot(static_cast<Kind>(k))];
}

std::vector<int64_t> drain_direct() {
  std::lock_guard<std::mutex> g(g_mutex);
  std::vector<int64_t> out(kLen, 0);
  out.swap(g_acc);
  return out;
}

}  // namespace npu_dispatch
