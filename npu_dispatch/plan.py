"""A copy plan, as ``explain()`` shows it: the types the C++ planner's answer decodes into
(``_native_plan.decode_plan``) and their words. The planning itself is C++ only
(``csrc/planner/plan.cpp``); nothing here decides which pair takes which path.

Paths, in the order the executor issues them:
- ``coalesced``: a *run* of pairs, in list order, whose destinations are contiguous and adjacent in
  one storage, and whose sources are too, with one device and dtype pair (empty and fallback pairs
  between them do not break it): one flat copy (FSDP's copy-in; csrc/planner/runs.h).
- ``foreach``: the remaining fast-route pairs, grouped by (device, src dtype, dst dtype); each
  group goes to the device's native batched kernel (ATen ``_foreach_copy_``; on CPU, the
  library's multi-tensor kernel).
- ``staged``: a cross-dtype group the device's kernel cannot convert (op-plugin below CANN 9.1:
  FSDP2's fp32 -> bf16 cast), where staging issues fewer launches than one copy per pair: one
  batched same-dtype copy of the sources into a contiguous scratch, then one flat cast into the
  destinations where they are one adjacent run, else a cast into a scratch of the destination
  dtype and a batched copy out; in chunks of at most the capability's ``stage_bytes``.
- ``fallback``: pairs off the fast route (broadcast, other device, strides, dtype pair not in the
  capability table...): stock ``copy_`` pair by pair, with the caller's ``non_blocking``.
- ``stock``: the whole call keeps stock's semantics. When reordering could change the result (a
  destination overlaps another tensor of the call, or a 0-dim conversion, whose bits in stock
  depend on the copies before it) or stock could raise midway, it runs as stock's CPU kernel does,
  a sequential ``copy_`` loop bumping each destination as it goes, so the same pairs are written
  (and bumped) before the same error; meta tensors too. Tensor subclasses, wrapper tensors and
  other layouts go to the stock op itself.
- ``empty``: zero-element pairs; stock ``copy_`` does nothing for them either.

On a device whose kernel batches many pairs a launch (npu), a coalesced run is dropped (its pairs
join their foreach group) only where that issues fewer launches; a tie keeps the flat copy. Where the device's own op batches
lists itself (op-plugin: ``csrc/planner/device_batching.h``), a source-dtype group it sends as one batched
host<->device memcpy is a *transfer group* handed to it as it is, and a whole-stock call (or one
none of whose pairs has a fast path) goes to that op whole, with its launches, bytes and errors.

Fast-route rules mirror ATen ``can_use_fast_route`` (``aten/src/ATen/native/ForeachUtils.h``):
same device, strided, non-overlapping and dense, equal sizes, equal strides except on size-1 dims.
"""
from __future__ import annotations

import dataclasses

import torch

__all__ = ["Plan", "Run", "Group", "Stage"]


def _inference_text(i: int) -> str:
    return (f"dst[{i}] has no version counter (an inference tensor, or one that took an inference "
            "tensor's place through .data) outside inference_mode: stock raises there, after "
            "writing it")


def _empty_write_text(i: int) -> str:
    return (f"dst[{i}] is empty and its storage refuses its data pointer or is copy-on-write: stock's "
            "copy_ raises or materializes it there, after writing the pairs before it")


def _odd_dtype_text(i: int, sdt: torch.dtype, ddt: torch.dtype) -> str:
    return (
        f"pair {i} copies {_dt(sdt)}->{_dt(ddt)}: stock copy_ may raise for that dtype, "
        "after writing the pairs before it"
    )


def _lazy_bit_dst_text(i: int) -> str:
    return (
        f"dst[{i}] has a lazy conjugate or negative bit: stock refuses such a mutable list "
        "before writing, so the call goes to the stock op"
    )


def _zero_dim_cast_text(i: int, sdt: torch.dtype, ddt: torch.dtype) -> str:
    # torch 2.13's CPU copy (reduced_float_type_copy, aten/src/ATen/native/cpu/CopyKernel.cpp)
    # reads strides(0)[0] of a TensorIterator with no dimensions: stale stack memory, which the
    # copies before it left (valgrind: "uninitialised value(s) ... created by a stack allocation
    # at copy_impl"). It picks the vectorized fp32 -> bf16 loop (a NaN becomes 0xffff) or the
    # scalar one (0x7fc0): 0xffff right after an fp32 -> bf16 pair of the same _foreach_copy_,
    # even an empty one. Stock's own loop, issued above ADInplaceOrView as stock issues it,
    # reproduces that; where the caller's stack decides, either can come out
    # (docs/stock_quirks.md).
    return (
        f"pair {i} converts a 0-dim {_dt(sdt)} into {_dt(ddt)}: stock's bits for it depend on the "
        "copies before it, so the call runs as stock's sequential copy_ loop"
    )


@dataclasses.dataclass
class Run:
    """A coalesced span: pairs ``indices`` become one flat copy of ``numel`` elements."""

    indices: list[int]
    numel: int
    device: torch.device
    src_dtype: torch.dtype
    dst_dtype: torch.dtype


@dataclasses.dataclass
class Group:
    """Fast-route pairs of one (device, src dtype, dst dtype), sent to the native kernel."""

    indices: list[int]
    device: torch.device
    src_dtype: torch.dtype
    dst_dtype: torch.dtype
    launches: int
    # A source-dtype group the device's own op copies as one batched host <-> device memcpy
    # (op-plugin memcpyBatch), handed to it as it is; ``src_device`` is its sources' device.
    transfer: bool = False
    src_device: torch.device | None = None


@dataclasses.dataclass
class Stage:
    """A staged cast (one chunk): a cross-dtype group the device's kernel cannot convert, copied
    through scratch memory. Its sources go to a contiguous ``src_dtype`` scratch of ``numel``
    elements in one batched same-dtype copy; then one flat cast into the destinations where they
    are one ``adjacent`` run, else a cast into a ``dst_dtype`` scratch and a batched copy out."""

    indices: list[int]
    numel: int
    device: torch.device
    src_dtype: torch.dtype
    dst_dtype: torch.dtype
    adjacent: bool
    launches: int


@dataclasses.dataclass
class Plan:
    """What the executor will do for one call; ``str(plan)`` is the human-readable form.

    ``reasons`` maps a fallback pair index to ``(kind, text)``; ``stock_reason`` is set when the
    whole call goes to the stock op.
    """

    n: int
    runs: list[Run] = dataclasses.field(default_factory=list)
    groups: list[Group] = dataclasses.field(default_factory=list)
    stages: list[Stage] = dataclasses.field(default_factory=list)
    fallback: list[int] = dataclasses.field(default_factory=list)
    empty: list[int] = dataclasses.field(default_factory=list)
    reasons: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)
    stock_reason: tuple[str, str] | None = None
    fallback_launches: int = 0
    # Device launches the call issues, as the planner counts them (csrc/planner/plan.h).
    launches: int = 0
    # Whether some pair leaves the fast path: what ``strict`` refuses (csrc/planner/plan.h).
    leaves_fast_path: bool = False

    def __str__(self) -> str:
        lines = [f"plan for {self.n} pair(s): {self.launches} device launch(es)"]
        if self.stock_reason is not None:
            lines.append(f"  whole call -> stock: {self.stock_reason[1]}")
            return "\n".join(lines)
        for r in self.runs:
            lines.append(
                f"  coalesced run pairs {_span(r.indices)}: 1 flat copy of {r.numel} elements "
                f"{_dt(r.src_dtype)}->{_dt(r.dst_dtype)} on {r.device}"
            )
        for g in self.groups:
            if g.transfer:
                lines.append(
                    f"  transfer group pairs {_span(g.indices)} ({len(g.indices)} tensors) "
                    f"{g.src_device}->{g.device}: the device's own op, 1 batched memcpy")
                continue
            lines.append(
                f"  foreach group pairs {_span(g.indices)} ({len(g.indices)} tensors) "
                f"{_dt(g.src_dtype)}->{_dt(g.dst_dtype)} on {g.device}: {g.launches} launch(es)"
            )
        for s in self.stages:
            how = ("1 flat cast into the adjacent destinations" if s.adjacent
                   else f"1 cast into a {_dt(s.dst_dtype)} scratch, a batched copy out")
            lines.append(
                f"  staged group pairs {_span(s.indices)} ({len(s.indices)} tensors) "
                f"{_dt(s.src_dtype)}->{_dt(s.dst_dtype)} on {s.device}: a batched copy into a "
                f"{s.numel}-element {_dt(s.src_dtype)} scratch, then {how}: {s.launches} launch(es)"
            )
        if self.empty:
            lines.append(f"  empty pairs {_span(self.empty)}: nothing to copy")
        for i in self.fallback:
            lines.append(f"  fallback pair {i}: {self.reasons[i][1]}")
        return "\n".join(lines)


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _span(indices: list[int]) -> str:
    if len(indices) > 1 and indices[-1] - indices[0] == len(indices) - 1:
        return f"{indices[0]}..{indices[-1]}"
    if len(indices) > 8:
        return ", ".join(map(str, indices[:8])) + f", ... ({len(indices)} in all)"
    return ", ".join(map(str, indices))


def _whole_list_text(name: str) -> str:
    return (
        f"{name}: stock's batched kernel takes only whole lists of one device, one source dtype, one "
        "destination dtype and equal sizes and strides pair by pair; stock copies this list pair by pair"
    )
