#include "dispatch/mode_scope.h"

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

// One entry of a scope on a thread's debug-info chain. An entry that could not be popped on exit
// (something pushed after it, a profiler started in the block, is still on top) is marked exited
// and stays, ignored, until it reaches the top again.
struct ScopeEntry final : c10::DebugInfoBase {
  std::shared_ptr<ModeScope> scope;
  bool exited = false;  // written and read on its own thread only
};

struct Entry {
  int64_t id;
  std::shared_ptr<ScopeEntry> entry;
};
thread_local std::vector<Entry> t_entries;

// The entry on top of this thread's chain, if the top is of the scope kind.
ScopeEntry* top_entry() {
  try {
    return static_cast<ScopeEntry*>(c10::ThreadLocalDebugInfo::_peek(kScopeKind).get());
  } catch (const c10::Error&) {
    return nullptr;  // empty chain, or another kind on top
  }
}

std::shared_ptr<ModeScope> find(int64_t id) {
  std::lock_guard<std::mutex> g(g_mutex);
  auto it = scopes().find(id);
  return it == scopes().end() ? nullptr : it->second;
}

}  // namespace

ModeScope* active_scope() {
  // Only the owned ops' kernels ask; the lookup walks this thread's short debug-info chain.
  auto* e = static_cast<ScopeEntry*>(c10::ThreadLocalDebugInfo::get(kScopeKind));
  return e == nullptr || e->exited ? nullptr : e->scope.get();
}

int64_t scope_new() {
  auto s = std::make_shared<ModeScope>();
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
  auto e = std::make_shared<ScopeEntry>();
  e->scope = std::move(s);
  c10::ThreadLocalDebugInfo::_push(kScopeKind, e);
  t_entries.push_back({id, std::move(e)});
}

void scope_exit(int64_t id) {
  TORCH_CHECK(!t_entries.empty() && t_entries.back().id == id,
              "NpuFastCopyMode exited out of order: exit modes in the reverse order of entry, on the thread "
              "that entered them");
  // Entries left behind by earlier exits come off first, once they are on top again.
  for (ScopeEntry* top = top_entry(); top != nullptr && top->exited; top = top_entry()) {
    c10::ThreadLocalDebugInfo::_pop(kScopeKind);
  }
  ScopeEntry* mine = t_entries.back().entry.get();
  if (top_entry() == mine) {
    c10::ThreadLocalDebugInfo::_pop(kScopeKind);
  } else {
    mine->exited = true;  // under something still pushed (a profiler started in the block)
  }
  t_entries.pop_back();
}

std::optional<StatsTotals> scope_drain(int64_t id) {
  auto s = find(id);
  if (s == nullptr) return std::nullopt;
  return s->stats->drain();
}

void record_call(CountedOp op, const CallResult& counts, int64_t nanoseconds) {
  if (ModeScope* s = active_scope()) {
    s->stats->record(op, counts, nanoseconds);
  } else {
    record_direct(op, counts, nanoseconds);
  }
}

}  // namespace npu_dispatch
