#include "mode_scope.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace npu_dispatch {
namespace {

constexpr std::string_view kScopeName = "NPU_DISPATCH_MODE_SCOPE";
const c10::DebugInfoKind kScopeKind(&kScopeName);

std::mutex g_mutex;
std::unordered_map<int64_t, std::shared_ptr<ModeScope>>& scopes() {
  static auto* m = new std::unordered_map<int64_t, std::shared_ptr<ModeScope>>();  // kernels may run at exit
  return *m;
}
int64_t g_next_id = 1;

struct Entry {
  int64_t id;
  std::shared_ptr<c10::ThreadLocalDebugInfo> saved;
};
thread_local std::vector<Entry> t_entries;

std::shared_ptr<ModeScope> find(int64_t id) {
  std::lock_guard<std::mutex> g(g_mutex);
  auto it = scopes().find(id);
  return it == scopes().end() ? nullptr : it->second;
}

}  // namespace

ModeScope* active_scope() {
  // Only the owned ops' kernels ask; the lookup walks this thread's short debug-info chain.
  return static_cast<ModeScope*>(c10::ThreadLocalDebugInfo::get(kScopeKind));
}

int64_t scope_new(bool probe) {
  auto s = std::make_shared<ModeScope>();
  s->probe = probe;
  std::lock_guard<std::mutex> g(g_mutex);
  const int64_t id = g_next_id++;
  scopes().emplace(id, std::move(s));
  return id;
}

void scope_free(int64_t id) {
  std::lock_guard<std::mutex> g(g_mutex);
  scopes().erase(id);  // a thread still carrying it keeps its own reference
}

void scope_enter(int64_t id) {
  auto s = find(id);
  TORCH_CHECK(s != nullptr, "npu_dispatch: unknown mode scope ", id);
  t_entries.push_back({id, c10::ThreadLocalDebugInfo::current()});
  c10::ThreadLocalDebugInfo::_push(kScopeKind, std::move(s));
}

void scope_exit(int64_t id) {
  TORCH_CHECK(!t_entries.empty() && t_entries.back().id == id,
              "NpuFastCopyMode exited out of order: exit modes in the reverse order of entry, on the thread "
              "that entered them");
  c10::ThreadLocalDebugInfo::_forceCurrentDebugInfo(std::move(t_entries.back().saved));
  t_entries.pop_back();
}

std::vector<int64_t> scope_drain(int64_t id) {
  auto s = find(id);
  return s == nullptr ? std::vector<int64_t>() : s->stats->drain();
}

void record_call(CountedOp op, const std::vector<int64_t>& counts, int64_t nanoseconds) {
  if (ModeScope* s = active_scope()) {
    s->stats->record(op, counts, nanoseconds);
  } else {
    record_direct(op, counts, nanoseconds);
  }
}

}  // namespace npu_dispatch
