// The planner's answer for the commonest call, found without its per-pair bookkeeping: every pair
// an ordinary dense CPU tensor pair, contiguous, of one shape, of a dtype pair the CPU kernel
// copies exactly, with no memory shared between a destination and anything else. For such a call
// the full planner (plan.cpp) would put every pair on the fast route with no fallback; the lane
// builds the same runs and groups (and the same counts). Any other call is refused before
// anything is written, and the caller plans it in full.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "capability_table.h"
#include "cpu_copy_kernel.h"

namespace npu_dispatch {

// Calls the lane has run since load, and of those the ones whose metadata pass was split across
// two threads (tests check which way a call went).
int64_t fast_lane_calls();
int64_t fast_lane_split_calls();
// Lists of at least this many pairs given to the direct entry read their sources' metadata on a
// second thread while the calling thread reads the destinations'. Returns the previous value; a
// negative argument only reads it. Tests lower it to send short lists through the split pass.
int64_t fast_lane_split_pairs(int64_t min_pairs);

class FastLane {
 public:
  // Reads metadata only. Returns false when the call needs the full planner; raises what
  // StorageImpl's data access checks raise, at the pair where the serial walk would. `n` > 0
  // pairs. With `grad_check`, a tensor that requires grad is refused too (grad mode is on and
  // the caller bypassed the dispatcher, whose Autograd kernel must see the call).
  // `may_split`: long lists may read their sources on a second thread (fast_lane_split_pairs).
  // The direct entry's lists come straight from Python, their metadata often out of cache;
  // lists the dispatcher has just unboxed are in cache, and a second thread only costs there.
  bool prepare(c10::TensorImpl* const* dsts, c10::TensorImpl* const* srcs, size_t n,
               const CapabilityTable& caps, bool grad_check, bool may_split);
  bool prepare(at::TensorList dsts, at::TensorList srcs, const CapabilityTable& caps);
  // Destination bytes the kernel will write (decides whether the caller drops the GIL).
  int64_t bytes() const { return bytes_; }
  // Copies every pair in one kernel pass; returns the count vector of execute.h. No version
  // counter moves here.
  std::vector<int64_t> run();

  // What one side of one pair needs for planning, read from its TensorImpl and StorageImpl.
  struct Facts {
    static constexpr uint32_t kInlineDims = 4;
    const char* data;  // at the storage offset; set only for a non-empty tensor
    const c10::StorageImpl* storage;
    const int64_t* sizes;  // the TensorImpl's own array (compared only past kInlineDims dims)
    int64_t numel;
    int64_t inline_sizes[kInlineDims];
    uint32_t dim;
    c10::ScalarType dtype;
    uint8_t itemsize;
  };
  enum class Read : uint8_t { Ok, Refused, Raised };
  // One side's pass over its n tensors: it stops at the first tensor the lane refuses or whose
  // data access raised; `stop` is that index (n when none).
  struct SidePass {
    std::unique_ptr<Facts[]> facts;
    size_t stop = 0;
    std::exception_ptr error;  // set when the access at `stop` raised
  };

 private:
  struct Span {
    uintptr_t start, end;
  };
  struct Group {
    uint16_t dtypes;  // dtype_pair()
    int64_t tensors, bytes;
  };
  // One pair of the serial walk, given what reading each side gave. False refuses the call
  // (a side's refusal, a dtype pair or shapes the lane does not take, a 0-dim conversion, a run
  // across storages); then a side's error is raised, the destination's first.
  bool add_pair(const Facts& df, Read dr, const std::exception_ptr& de, const Facts& sf, Read sr,
                const std::exception_ptr& se);
  void close_run();
  bool disjoint();

  const Capability* cap_ = nullptr;
  CpuCopyBatch batch_;
  std::vector<Span> dst_spans_, src_spans_;
  std::vector<Group> groups_;
  size_t last_group_ = 0;
  // The last dtype pair routed, and its op.
  c10::ScalarType last_s_ = c10::ScalarType::Undefined, last_d_ = c10::ScalarType::Undefined;
  CopyOp op_ = CopyOp::Memcpy;
  bool mergeable_ = false;
  // The run being built: adjacent contiguous pairs of one dtype pair in one storage each.
  const c10::StorageImpl* run_dst_storage_ = nullptr;
  const c10::StorageImpl* run_src_storage_ = nullptr;
  int64_t run_len_ = 0, run_bytes_ = 0;
  uint16_t run_dtypes_ = 0;  // dtype_pair(src, dst) of the run
  int64_t runs_ = 0, run_tensors_ = 0, coalesced_bytes_ = 0;
  int64_t empty_ = 0, bytes_ = 0;
};

}  // namespace npu_dispatch
