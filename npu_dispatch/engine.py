"""Runs a plan: the one place where the fast path touches data.

Shared by ``NpuFastCopyMode`` and the direct ops. Two implementations of one contract:

- native (``_native.load()`` succeeded): one call to the C++ entry ``foreach_copy_planned``
  (csrc/python_entry.cpp), which plans and executes in C++ (``csrc/``) and returns a fixed-size count vector, so the
  Python work per call does not grow with the number of tensors;
- Python (no compiler, failed build, ``NPU_DISPATCH_NATIVE=0``): ``plan.build_plan`` and
  ``_execute`` below. Slower per tensor, same results.

Everything issued from here reaches the stock ATen ops (or the C++ CPU kernel); a thread-local
flag tells every ``NpuFastCopyMode`` on the stack to pass those calls through, so nested modes
neither plan twice nor count twice.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Sequence

import torch
import torch.autograd.forward_ad as _fwad

from . import _native, capabilities
from . import plan as _plan
from ._native_plan import BLOCKED, DEFERRED, decode_counts, native_plan
from .errors import FastCopyFallbackError, FastCopyMismatchError
from .stats import CopyStats

__all__ = ["busy", "recorded", "stock_bumps", "foreach_copy", "all_gather_copy_in"]

_local = threading.local()
_aten_foreach_copy_ = torch.ops.aten._foreach_copy_.default
_profiling = torch._C._autograd._profiler_enabled


_AD_INPLACE_OR_VIEW = torch._C.DispatchKey.ADInplaceOrView


def stock_bumps(dsts: Sequence) -> bool:
    """Whether stock ``_foreach_copy_`` called here would bump the destinations' version counters.

    Always, except below ADInplaceOrView (``torch._C._AutoDispatchBelowADInplaceOrView``), where
    its per-pair route, a ``copy_`` loop, bumps nothing. A batched kernel may bump there anyway:
    CUDA's does (``foreach_tensor_copy_list_kernel_cuda_``), and the executors see it happen
    (``_self_bumping_copy``), so CPU and ``whole_list_only`` devices need no bump of ours there.
    Other accelerators (NPU: unknown, no device here) keep the bumps.
    For callers that bypass the dispatcher (a dispatch mode's handler sees ADInplaceOrView
    excluded on every call, so it must not ask).
    """
    if not torch._C._dispatch_tls_is_dispatch_key_excluded(_AD_INPLACE_OR_VIEW):
        return True
    for d in dsts:
        if isinstance(d, torch.Tensor) and d.device.type != "cpu":
            cap = capabilities.lookup(d.device.type)
            if cap is None or not cap.whole_list_only:
                return True
    return False


def recorded() -> bool:
    """Whether a compiler, the JIT tracer or forward-mode AD must see the op itself: callers that
    would otherwise reach the fast lane without the dispatcher (the direct op, the mode's front)
    step aside then."""
    return (torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None
            or _fwad._current_level >= 0)


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


# CPU dtype pairs whose stock copy converts each element alike wherever it sits: a byte copy, or
# ATen's vectorized fp32<->bf16 (partial vectors at the tail, no scalar path). A run never holds
# a 0-dim conversion: the planner sends those calls to stock's loop (order_dependent).
_CPU_FLAT_OK = frozenset((d, d) for d in capabilities.COPY_DTYPES) | {
    (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)
}


def _nbytes(tensors: Sequence[torch.Tensor], idx: list[int]) -> int:
    return sum(tensors[i].numel() * tensors[i].element_size() for i in idx)


def _self_bumping_copy(dsts, srcs, non_blocking: bool) -> bool:
    """``_foreach_copy_`` of the lists; True when the device's kernel bumped their version
    counters itself. CUDA's fused route (multi_tensor_apply) does, even below ADInplaceOrView,
    as it does under stock; its per-pair route does not. One listed counter tells which ran."""
    probe = next((d for d in dsts if not _plan._no_version_counter(d)), None)
    before = probe._version if probe is not None else 0
    _aten_foreach_copy_(dsts, srcs, non_blocking)
    return probe is not None and probe._version != before


_set_versions = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)


def _bump(dsts, srcs) -> None:
    """One version bump per destination, as stock's in-place copy makes. ``increment_version``
    skips every ``is_inference()`` tensor, but a normal tensor given an inference tensor's
    ``.data`` is one and keeps its counter, which stock bumps, except inside inference_mode when
    the pair's source is inference-keyed too (csrc/execute.h stock_bumps_pair)."""
    torch.autograd.graph.increment_version(dsts)
    if _set_versions is not None:
        in_inference = None
        for d, s in zip(dsts, srcs):
            if d.is_inference() and not _plan._no_version_counter(d):
                if in_inference is None:
                    in_inference = torch.is_inference_mode_enabled()
                if not (in_inference and s.is_inference()):
                    _set_versions((d,), (d._version + 1,))


# Whole-stock reasons that stock's per-pair route (a copy_ loop) serves.
_PER_PAIR_ROUTE = ("aliasing", "may_raise", "meta", "order_dependent", "whole_list_route")


def _stock(p: _plan.Plan, dsts, srcs, non_blocking: bool, bump: bool) -> None:
    """A whole-stock plan, bumping version counters as stock does (see plan.py)."""
    if p.stock_reason[0] in _PER_PAIR_ROUTE and bump and not torch._C._dispatch_tls_is_dispatch_key_excluded(
            _AD_INPLACE_OR_VIEW):
        # Called above ADInplaceOrView (_python_path leaves it on for this): each copy_ bumps, and
        # raises for a destination without a counter, as the copy_ calls of stock's loop do.
        # Issued above it, as stock's are, they also write stock's bits for a 0-dim fp32 -> bf16
        # NaN in every case tried (stale stack memory picks them: order_dependent, plan.py).
        for d, s in zip(dsts, srcs):
            d.copy_(s, non_blocking=non_blocking)
        return
    if p.stock_reason[0] in _PER_PAIR_ROUTE:
        # Stock's per-pair route (CPU's kernel; CUDA's for lists it does not batch): a copy_ loop;
        # an error leaves the earlier pairs written and bumped. Here (the mode's handler, below
        # ADInplaceOrView) a 0-dim fp32 -> bf16 NaN can come out in stock's other encoding
        # (docs/stock_quirks.md; tests/test_ops.py, a known difference).
        outside_inference = not torch.is_inference_mode_enabled()
        for d, s in zip(dsts, srcs):
            d.copy_(s, non_blocking=non_blocking)
            # Stock's version bump raises this, after the write (no bump, no error).
            if bump and outside_inference and _plan._no_version_counter(d):
                raise RuntimeError(_plan.INFERENCE_WRITE_ERROR)
            if bump:
                _bump((d,), (s,))
        return
    if not _self_bumping_copy(dsts, srcs, non_blocking) and bump:
        _bump(dsts, srcs)


def _execute(p: _plan.Plan, dsts, srcs, non_blocking: bool, bump: bool = False,
             self_bumped: set | None = None) -> dict:
    """Issue the plan's copies; returns path -> (tensors, bytes, launches) for the stats.

    Only a whole-stock plan bumps version counters here (``bump``); the caller bumps the others,
    except the indices added to ``self_bumped``: a device's fused kernel bumped those already.
    """
    counts: dict[str, tuple[int, int, int]] = {}
    if p.stock_reason is not None:
        with _range("stock"):
            _stock(p, dsts, srcs, non_blocking, bump)
        return {"stock": (p.n, _nbytes(dsts, range(p.n)), p.n)}
    if p.runs:
        nbytes = 0
        with _range("coalesced"):
            for r in p.runs:
                d0, s0 = dsts[r.indices[0]], srcs[r.indices[0]]
                nbytes += r.numel * d0.element_size()
                if d0.device.type == "cpu" and (s0.dtype, d0.dtype) not in _CPU_FLAT_OK:
                    # Stock's CPU result can depend on where a copy ends (FBGEMM's fp16 tails,
                    # scalar tails of at::vec::convert): copy pair by pair, as stock does.
                    _aten_foreach_copy_(
                        [dsts[i] for i in r.indices], [srcs[i] for i in r.indices], non_blocking
                    )
                    continue
                # One flat copy over the run: the same elementwise conversion stock applies per
                # pair, so every bit matches, in one launch instead of len(r.indices).
                flat_d = d0.as_strided((r.numel,), (1,), d0.storage_offset())
                flat_s = s0.as_strided((r.numel,), (1,), s0.storage_offset())
                flat_d.copy_(flat_s, non_blocking=non_blocking)
        counts["coalesced"] = (sum(len(r.indices) for r in p.runs), nbytes, len(p.runs))
    if p.groups:
        tensors = nbytes = launches = 0
        with _range("foreach"):
            for g in p.groups:
                if _self_bumping_copy([dsts[i] for i in g.indices], [srcs[i] for i in g.indices], non_blocking):
                    if self_bumped is not None:
                        self_bumped.update(g.indices)
                tensors += len(g.indices)
                nbytes += _nbytes(dsts, g.indices)
                launches += g.launches
        counts["foreach"] = (tensors, nbytes, launches)
    if p.fallback:
        with _range("fallback"):
            # Pair by pair, as stock's per-tensor path: a sub-list handed to the device's
            # _foreach_copy_ could take a route the full list would not (op-plugin's batched H2D
            # memcpy of a now uniform list copies raw bytes and ignores strides).
            for i in p.fallback:
                dsts[i].copy_(srcs[i], non_blocking=non_blocking)
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
    # Same sizes and strides as each destination: stock's CPU copy picks its kernel (and with it
    # NaN bits) from the layout, and clone() would make a strided destination contiguous.
    ref = [torch.empty_strided(d.shape, d.stride(), dtype=d.dtype, device=d.device).copy_(d) for d in dsts]
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
    defer_if_grad: bool = False,
) -> bool:
    """``_foreach_copy_(dsts, srcs, non_blocking)`` through the planner; see ``plan.py``.

    Bumps each listed destination's version counter once, as stock's in-place op does without
    a mode (``bump=False`` for the functional variant, whose fresh outputs stay at version 0).

    ``defer_if_grad`` (callers that bypass the dispatcher): when grad mode is on and a tensor
    requires grad, do nothing and return False, so the caller goes through the op, whose
    Autograd kernel must see the copy. Returns True when the copy was done.

    Raises:
        RuntimeError: stock's list-level errors (before writing), or whatever stock raises for a
            pair when the whole call went to stock.
        FastCopyFallbackError: ``strict`` and some pair would fall back (nothing is written).
        FastCopyMismatchError: ``verify`` and the result differs bitwise from stock.
    """
    planned = _native.planned_op()
    if planned is None or verify:  # the native entry makes these checks itself, in C++
        if _plan.lazy_bit_dst(dsts) is not None:
            # Stock's dispatcher raises for such a list before checking it: its error, from it.
            _aten_foreach_copy_(list(dsts), list(srcs), non_blocking)
            stats.record_passthrough(op, "conj_neg")
            return True
        _plan.check_lists(dsts, srcs)
    if defer_if_grad and (planned is None or verify) and torch.is_grad_enabled() and any(
        t.requires_grad for t in (*dsts, *srcs)
    ):
        return False
    start = time.perf_counter()
    # Version counters: one bump per listed destination, as stock's in-place op makes, even inside
    # inference_mode (inference tensors have no counter: _bump skips them).
    if planned is None or verify:
        counts, reasons, bumped = (
            _python_path(dsts, srcs, non_blocking, op, strict, verify, bump) if planned is None
            else _native_verify(planned, dsts, srcs, non_blocking, op, strict, bump)
        )
        if bump and bumped is not True:
            if bumped:
                keep = [i for i in range(len(dsts)) if i not in bumped]
                _bump([dsts[i] for i in keep], [srcs[i] for i in keep])
            else:
                _bump(dsts, srcs)
    else:
        # One C++ call: plan, copies (below ADInplaceOrView) and the version bumps.
        with _inside():
            v = planned(dsts, srcs, non_blocking, strict, bump, defer_if_grad)
        flags, counts, reasons = decode_counts(v)
        if flags & DEFERRED:
            return False
        if flags & BLOCKED:
            raise _strict_error(op, native_plan(dsts, srcs))
    stats.record_counts(op, counts, reasons, time.perf_counter() - start)
    return True


def _strict_error(op: str, p: _plan.Plan) -> FastCopyFallbackError:
    why = p.stock_reason[1] if p.stock_reason else "; ".join(p.reasons[i][1] for i in p.fallback)
    return FastCopyFallbackError(f"npu_dispatch strict: {op} falls back: {why}")


def _reasons(p: _plan.Plan) -> dict:
    reasons: dict[str, int] = {}
    if p.stock_reason is not None:
        reasons[p.stock_reason[0]] = 1
    for i in p.fallback:
        kind = p.reasons[i][0]
        reasons[kind] = reasons.get(kind, 0) + 1
    return reasons


def _python_path(dsts, srcs, non_blocking, op, strict, verify, bump) -> tuple[dict, dict, "bool | set"]:
    p = _plan.build_plan(dsts, srcs)
    if strict and (p.stock_reason is not None or p.fallback):
        raise _strict_error(op, p)
    counts: dict = {}
    self_bumped: set = set()

    def run() -> None:
        nonlocal counts
        counts = _execute(p, dsts, srcs, non_blocking, bump, self_bumped)

    # Below ADInplaceOrView, the copies issued here bump no version counter; the one bump per
    # listed destination that stock's in-place kernel makes is done once, by foreach_copy. Stock's
    # per-pair route, where stock bumps, runs its copy_ calls above it, as stock's kernel does
    # (_stock).
    per_pair = p.stock_reason is not None and p.stock_reason[0] in _PER_PAIR_ROUTE and bump
    below = contextlib.nullcontext() if per_pair else torch._C._AutoDispatchBelowADInplaceOrView()
    with _inside(), below:
        if verify and p.stock_reason is None and not _plan.whole_list_call(dsts, srcs):
            _verify(p, dsts, srcs, non_blocking, run)
        else:
            run()
    return counts, _reasons(p), True if p.stock_reason is not None else self_bumped


def _native_verify(planned, dsts, srcs, non_blocking, op, strict, bump) -> tuple[dict, dict, bool]:
    # Debugging aid: plan first (O(n) Python) to know whether stock runs the whole call.
    p = native_plan(dsts, srcs)
    if strict and (p.stock_reason is not None or p.fallback):
        raise _strict_error(op, p)
    v = None

    def run() -> None:
        nonlocal v
        v = planned(dsts, srcs, non_blocking, False, bump)  # bumps as the native path does

    with _inside(), torch._C._AutoDispatchBelowADInplaceOrView():
        if p.stock_reason is None and not _plan.whole_list_call(dsts, srcs):
            _verify(p, dsts, srcs, non_blocking, run)
        else:
            run()
    _, counts, reasons = decode_counts(v)
    return counts, reasons, True


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
    bump: bool = True,
    force_views: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FSDP2's copy-in, as ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`` does it.

    Narrows ``all_gather_output`` (1-D, ``world_size * all_gather_input_numel`` elements) to this
    rank's slice, splits it by ``inp_split_sizes`` and copies ``all_gather_inputs`` (1-D shards)
    into the splits. Returns ``(all_gather_input, all_gather_output)``; the first is a view of the
    second. Narrow and split raise stock's errors, before anything is written. ``bump``: as for
    :func:`foreach_copy` (each split of the output moves the output's counter once).
    """
    # The views carry autograd view metadata (``_base``, a shared version counter) where stock's do.
    # A dispatch mode's handler always runs with ADInplaceOrView excluded, though the caller's
    # stock call would have made views: the mode passes ``force_views``. Any other caller below
    # ADInplaceOrView gets what stock gives there: no view metadata.
    views = contextlib.nullcontext()
    if force_views:
        exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.ADInplaceOrView)
        views = torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)
    with views:
        all_gather_input = all_gather_output.narrow(0, all_gather_input_numel * rank, all_gather_input_numel)
        dsts = torch.split(all_gather_input, inp_split_sizes)
    with torch.no_grad():
        foreach_copy(dsts, all_gather_inputs, False, stats=stats, op=op, strict=strict, verify=verify, bump=bump)
    return all_gather_input, all_gather_output
