// The copy planner: a list of pairs, each classified by the one rule (planner/classify.h), becomes
// coalesced runs, dtype groups for the device's batched kernel, staged casts and fallback pairs, or
// a whole call left to stock, with a named reason for every pair off the fast path.
// npu_dispatch's Python side only renders plans (npu_dispatch/_native_plan.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "planner/capability_table.h"
#include "planner/classify.h"

namespace npu_dispatch {

struct Run {
  int64_t begin, end;  // into Plan::run_members
  int64_t numel;
};

struct Group {
  int64_t begin, end;  // into Plan::group_members
  int64_t launches;
  // A source-dtype group the device's own op sends as one batched host <-> device memcpy
  // (device_batching.h): handed to that op as it is.
  bool transfer;
};

// A stage: a cross-dtype group the device's batched kernel cannot convert, copied in fewer launches
// through scratch memory: one same-dtype batched copy of the sources into a contiguous scratch of the
// source dtype, then one flat cast into the destinations where they are one adjacent run, else a
// cast into a destination-dtype scratch and a batched copy out of it. One entry per chunk.
struct Stage {
  int64_t begin, end;  // into Plan::stage_members, in list order
  int64_t numel;  // elements of the chunk: the scratch size
  bool adjacent;  // the destinations are one adjacent run
  int64_t launches;
};

struct Fallback {
  int64_t index;
  Kind kind;
  int8_t sub;  // which side / which variant, only for the reason text
};

struct Plan {
  int64_t n = 0;
  Kind stock = Kind::None;  // whole call to the stock op when set
  int64_t stock_a = -1, stock_b = -1;
  int8_t stock_sub = 0;
  std::vector<int64_t> run_members, group_members, stage_members, empty;
  std::vector<Run> runs;
  std::vector<Group> groups;
  std::vector<Stage> stages;
  std::vector<Fallback> fallback;  // sorted by index
  int64_t fallback_launches = 0;
  // A whole-stock plan on a device whose own op batches lists (device_batching.h): that op takes the
  // call whole, issuing stock_launches launches.
  bool own_op = false;
  int64_t stock_launches = -1;
  // A whole-stock plan because no pair has a fast path (that own op takes the call whole): `stock`
  // is the first fallback pair's reason (explain's); the stats count each pair under its own.
  bool no_fast_pair = false;

  // Whether some pair leaves the fast path (the whole call to stock, or a fallback pair): what
  // `strict` refuses, nothing written.
  bool leaves_fast_path() const { return stock != Kind::None || !fallback.empty(); }
  // Device launches the call issues: a whole-stock call's (stock's op pair by pair, or the
  // device's own op), else one per coalesced run plus each group's, stage's and fallback pair's.
  int64_t launches() const;
};


// Plans without touching data. Lists must be non-empty and of equal length (check first).
Plan build_plan(at::TensorList dsts, at::TensorList srcs, const CapabilityTable& caps, bool non_blocking = false);

void check_lists(at::TensorList dsts, at::TensorList srcs);

// Pairs whose version counter stock's own op leaves unmoved: on a device whose batched kernels
// keep versions (Capability::batched_keeps_versions), the pairs of each source-dtype group that
// kernel takes, as op-plugin groups and sends a list. Empty when no pair is on such a device.
std::vector<uint8_t> stock_keeps_version(at::TensorList dsts, at::TensorList srcs, bool non_blocking,
                                         const CapabilityTable& caps);

}  // namespace npu_dispatch
