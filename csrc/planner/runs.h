// The coalescing rule, the one both list drivers apply (planner/plan.cpp, planner/one_pass.cpp):
// fast-route pairs, scanned in list order, form runs. A pair continues the open run where both its
// tensors are contiguous, it has the run's key (device, source and destination dtypes), each side
// starts where the run ends, and each side lies in the run's storage on that side (two
// allocations can sit side by side: caching allocators split one segment). A run of two or more
// pairs is one flat copy; a run of one is a single, and singles join their key's group, groups in
// the order of their first single.
#pragma once

#include <c10/core/TensorImpl.h>

#include <cstdint>

#include "planner/capability_table.h"

namespace npu_dispatch {

// A pair's key: its destination's device and the (source, destination) dtypes, packed.
inline uint32_t run_key(c10::Device device, c10::ScalarType src, c10::ScalarType dst) {
  return static_cast<uint32_t>(static_cast<uint8_t>(device.type())) |
         static_cast<uint32_t>(static_cast<uint8_t>(device.index())) << 8 |
         static_cast<uint32_t>(static_cast<uint8_t>(src)) << 16 | static_cast<uint32_t>(static_cast<uint8_t>(dst)) << 24;
}
inline uint32_t run_key(const c10::TensorImpl& d, const c10::TensorImpl& s) {
  return run_key(d.device(), s.dtype().toScalarType(), d.dtype().toScalarType());
}

// The device type of a key (run_key).
inline c10::DeviceType key_device_type(uint32_t key) { return static_cast<c10::DeviceType>(static_cast<int8_t>(key & 0xff)); }

// One contiguous fast-route pair as the rule sees it: its key, where each side starts (as the
// data pointer reads it), its bytes on each side and its storages.
struct RunPair {
  uint32_t key;
  uintptr_t d, s;
  int64_t dbytes, sbytes;
  const c10::StorageImpl* d_store;
  const c10::StorageImpl* s_store;
};

// The open run.
struct RunCursor {
  int64_t len = 0;  // pairs; 0: no run open
  int64_t dbytes = 0;  // destination bytes of the run
  RunPair end{};  // the key and storages of the run, where it ends on each side

  bool continues(const RunPair& p) const {
    return p.d == end.d && p.s == end.s && len > 0 && p.key == end.key && p.d_store == end.d_store &&
           p.s_store == end.s_store;
  }
  // The pair joins the run (continues() true) or opens a new one.
  void add(const RunPair& p, bool joins) {
    if (!joins) {
      len = 0;
      dbytes = 0;
      end = p;
    }
    ++len;
    dbytes += p.dbytes;
    end.d = p.d + p.dbytes;
    end.s = p.s + p.sbytes;
  }
};

// Whether every run of a device is kept as its own flat copy. On a device whose kernel batches many
// pairs a launch and is no host pass, a run costs a launch its pairs might share with their group:
// there the planner keeps the largest runs only while they issue fewer launches
// (planner/plan.cpp dissolve_runs); the one-pass plan takes only host passes, which keep every run.
inline bool keeps_every_run(const Capability& cap) { return cap.max_per_launch == 0 || cap.host_pass; }

// The index of `key`'s group in `keys` (any container of keys with size, operator[] and
// push_back), appended where new; `last`, the group hit last, is tried first (a list usually
// holds one key).
template <typename Keys>
size_t group_of(Keys& keys, uint32_t key, size_t& last) {
  if (last < keys.size() && keys[last] == key) return last;
  for (last = 0; last < keys.size(); ++last) {
    if (keys[last] == key) return last;
  }
  keys.push_back(key);
  return last;
}

}  // namespace npu_dispatch
