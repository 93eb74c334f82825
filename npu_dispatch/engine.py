"""Runs a plan: the one place where the fast path touches data.

Shared by ``NpuFastCopyMode`` and the direct ops. Everything issued from here reaches the stock
ATen ops; a thread-local flag tells every ``NpuFastCopyMode`` on the stack to pass those calls
through, so nested modes neither plan twice nor count twice.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Sequence

import torch

from . import plan as _plan
from .errors import FastCopyFallbackError, FastCopyMismatchError
from .stats import CopyStats

__all__ = ["busy", "foreach_copy", "all_gather_copy_in"]

_local = threading.local()
_aten_foreach_copy_ = torch.ops.aten._foreach_copy_.default
_profiling = torch._C._autograd._profiler_enabled


def busy() -> bool:
    """True while this thread is inside the engine (its own stock calls must pass through)."""
    return getattr(_local, "depth", 0) > 0


@contextlib.contextmanager
def _inside():
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def _range(name: str):
    # Named ranges only while a profiler runs: record_function costs microseconds per call.
    if _profiling():
        return torch.autograd.profiler.record_function(f"npu_dispatch::{name}")
    return contextlib.nullcontext()


def _nbytes(tensors: Sequence[torch.Tensor], idx: list[int]) -> int:
    return sum(tensors[i].numel() * tensors[i].element_size() for i in idx)


def _execute(p: _plan.Plan, dsts, srcs, non_blocking: bool) -> dict:
    """Issue the plan's copies; returns path -> (tensors, bytes, launches) for the stats."""
    counts: dict[str, tuple[int, int, int]] = {}
    if p.stock_reason is not None:
        with _range("stock"):
            _aten_foreach_copy_(dsts, srcs, non_blocking)
        return {"stock": (p.n, _nbytes(dsts, range(p.n)), p.n)}
    if p.runs:
        nbytes = 0
        with _range("coalesced"):
            for r in p.runs:
                d0, s0 = dsts[r.indices[0]], srcs[r.indices[0]]
                # One flat copy over the run: the same elementwise conversion stock applies per
                # pair, so every bit matches, in one launch instead of len(r.indices).
                flat_d = d0.as_strided((r.numel,), (1,), d0.storage_offset())
                flat_s = s0.as_strided((r.numel,), (1,), s0.storage_offset())
                flat_d.copy_(flat_s, non_blocking=non_blocking)
                nbytes += r.numel * d0.element_size()
        counts["coalesced"] = (sum(len(r.indices) for r in p.runs), nbytes, len(p.runs))
    if p.groups:
        tensors = nbytes = launches = 0
        with _range("foreach"):
            for g in p.groups:
                _aten_foreach_copy_(
                    [dsts[i] for i in g.indices], [srcs[i] for i in g.indices], non_blocking
                )
                tensors += len(g.indices)
                nbytes += _nbytes(dsts, g.indices)
                launches += g.launches
        counts["foreach"] = (tensors, nbytes, launches)
    if p.fallback:
        with _range("fallback"):
            _aten_foreach_copy_(
                [dsts[i] for i in p.fallback], [srcs[i] for i in p.fallback], non_blocking
            )
        counts["fallback"] = (len(p.fallback), _nbytes(dsts, p.fallback), p.fallback_launches)
    if p.empty:
        counts["empty"] = (len(p.empty), 0, 0)
    return counts


def _bits(t: torch.Tensor) -> torch.Tensor:
    # A fresh contiguous copy: .contiguous() keeps odd strides on size-1 dims, which view() rejects.
    flat = t.detach().reshape(-1).clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def _verify(p: _plan.Plan, dsts, srcs, non_blocking, run) -> None:
    """Run stock on clones of the destinations, then ours, and compare every bit."""
    ref = [d.clone() for d in dsts]
    _aten_foreach_copy_(ref, srcs, non_blocking)
    run()
    for i, (d, r) in enumerate(zip(dsts, ref)):
        if not torch.equal(_bits(d), _bits(r)):
            path = "fallback" if i in p.reasons else "fast path"
            raise FastCopyMismatchError(
                f"npu_dispatch verify: dst[{i}] ({path}) differs bitwise from stock "
                f"_foreach_copy_\n{p}"
            )


def foreach_copy(
    dsts: Sequence[torch.Tensor],
    srcs: Sequence[torch.Tensor],
    non_blocking: bool = False,
    *,
    stats: CopyStats,
    op: str = "aten._foreach_copy_",
    strict: bool = False,
    verify: bool = False,
    bump: bool = True,
) -> None:
    """``_foreach_copy_(dsts, srcs, non_blocking)`` through the planner; see ``plan.py``.

    Bumps each listed destination's version counter once, as stock's in-place op does without
    a mode (``bump=False`` for the functional variant, whose fresh outputs stay at version 0).

    Raises:
        RuntimeError: stock's list-level errors (before writing), or whatever stock raises for a
            pair when the whole call went to stock.
        FastCopyFallbackError: ``strict`` and some pair would fall back (nothing is written).
        FastCopyMismatchError: ``verify`` and the result differs bitwise from stock.
    """
    _plan.check_lists(dsts, srcs)
    start = time.perf_counter()
    p = _plan.build_plan(dsts, srcs)
    if strict and (p.stock_reason is not None or p.fallback):
        why = p.stock_reason[1] if p.stock_reason else "; ".join(p.reasons[i][1] for i in p.fallback)
        raise FastCopyFallbackError(f"npu_dispatch strict: {op} falls back: {why}")
    counts: dict = {}

    def run() -> None:
        nonlocal counts
        counts = _execute(p, dsts, srcs, non_blocking)

    # Below ADInplaceOrView, the copies issued here bump no version counter; the one bump per
    # listed destination that stock's in-place kernel makes is done once, below.
    with _inside(), torch._C._AutoDispatchBelowADInplaceOrView():
        if verify and p.stock_reason is None:
            _verify(p, dsts, srcs, non_blocking, run)
        else:
            run()
    if bump and not torch.is_inference_mode_enabled():
        torch.autograd.graph.increment_version(dsts)
    stats.record(op, p, counts, time.perf_counter() - start)


def all_gather_copy_in(
    all_gather_inputs: Sequence[torch.Tensor],
    all_gather_output: torch.Tensor,
    inp_split_sizes: Sequence[int],
    all_gather_input_numel: int,
    rank: int,
    *,
    stats: CopyStats,
    op: str = "fsdp.all_gather_copy_in",
    strict: bool = False,
    verify: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FSDP2's copy-in, as ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`` does it.

    Narrows ``all_gather_output`` (1-D, ``world_size * all_gather_input_numel`` elements) to this
    rank's slice, splits it by ``inp_split_sizes`` and copies ``all_gather_inputs`` (1-D shards)
    into the splits. Returns ``(all_gather_input, all_gather_output)``; the first is a view of the
    second. Narrow and split raise stock's errors, before anything is written.
    """
    all_gather_input = all_gather_output.narrow(0, all_gather_input_numel * rank, all_gather_input_numel)
    dsts = torch.split(all_gather_input, inp_split_sizes)
    with torch.no_grad():
        foreach_copy(dsts, all_gather_inputs, False, stats=stats, op=op, strict=strict, verify=verify)
    return all_gather_input, all_gather_output
