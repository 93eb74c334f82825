"""The Python side of a planned copy: one call into the C++ planner and the stats it returns.

Serves the debugging mode's handlers (``NpuFastCopyMode(strict=True)`` / ``(verify=True)``) and
the public ops' Python paths. The planning and every copy happen in C++
(``csrc/planner/copy_call.h`` ``plan_and_run``), through ``foreach_copy_planned``
(csrc/binding/module.cpp), which returns what it did as a ``CallResult``: named fields
``blocked``, ``paths``, ``reasons``. Without the native library every call goes to the stock op,
counted with reason ``no_native``.

Stock calls issued from here must not be planned again by a mode nested inside another: a
thread-local flag (``busy``) tells the debugging modes to pass them through.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Sequence

import torch

from . import _native
from ._native_plan import native_plan
from .errors import FastCopyFallbackError, FastCopyMismatchError
from .plan import Plan
from .stats import CopyStats

__all__ = ["busy", "inside", "foreach_copy", "all_gather_copy_in", "split_with_sizes_copy", "chunk_cat", "chunk_cat_mixed_dtype",
           "no_native_error"]

_local = threading.local()
_aten_foreach_copy_ = torch.ops.aten._foreach_copy_.default


def busy() -> bool:
    """True while this thread is inside the engine (its own stock calls must pass through)."""
    return getattr(_local, "depth", 0) > 0


@contextlib.contextmanager
def inside():
    """While open, this thread's calls of the owned ops are stock calls the library has counted
    already: the debugging modes and the counters without the native library pass them on."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def no_native_error(op: str) -> FastCopyFallbackError:
    return FastCopyFallbackError(f"npu_dispatch strict: {op} falls back: no_native ({_native.status()[1]})")


def _bits(t: torch.Tensor) -> torch.Tensor:
    # A fresh contiguous copy: .contiguous() keeps odd strides on size-1 dims, which view() rejects.
    flat = t.detach().reshape(-1).clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def _reference(dsts) -> list[torch.Tensor]:
    """Copies of the destinations with their sizes, strides and aliasing: each storage they use
    is cloned once and every copy is a view of its clone, as the destination is of its storage
    (stock's CPU copy picks its kernel, and with it NaN bits, from the layout; a list that names
    one tensor twice must stay one tensor)."""
    clones: dict = {}
    ref = []
    for d in dsts:
        storage = d.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes(), d.device)
        if key not in clones:
            clones[key] = storage.clone()
        ref.append(torch.empty(0, dtype=d.dtype, device=d.device).set_(
            clones[key], d.storage_offset(), d.shape, d.stride()))
    return ref


def _verify(p: Plan, dsts, srcs, non_blocking, run) -> None:
    """Run stock on copies of the destinations, then ours, and compare every bit."""
    ref = _reference(dsts)
    # Stock's op, which an entered NpuFastCopyMode's kernels would otherwise serve.
    _native.module().stock_foreach_copy(ref, list(srcs), non_blocking)
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
    op: str,
    strict: bool = False,
    verify: bool = False,
    bump: bool | None = True,
) -> None:
    """``_foreach_copy_(dsts, srcs, non_blocking)`` through the C++ planner (csrc/planner/copy_call.h).

    Bumps each listed destination's version counter once, as stock's in-place op does without
    a mode (``bump=False`` for the functional variant, whose fresh outputs stay at version 0;
    ``None``: stock's rule where the call is made, csrc/planner/copy_call.h ``foreach_copy_bumps_here``).


    Raises:
        RuntimeError: stock's list-level errors (before writing), or whatever stock raises for a
            pair when the whole call went to stock.
        FastCopyFallbackError: ``strict`` and some pair would fall back (nothing is written).
        FastCopyMismatchError: ``verify`` and the result differs bitwise from stock.
    """
    planned = _native.planned_op()
    if planned is None:
        # No native library: the stock op, which gives stock's results, errors and bumps.
        with inside():
            _aten_foreach_copy_(list(dsts), list(srcs), non_blocking)
        stats.record_no_native(op, len(dsts))
        return
    start = time.perf_counter()
    if verify:
        r = _native_verify(planned, dsts, srcs, non_blocking, op, strict, bump)
    else:
        # One C++ call: checks, plan, copies (below ADInplaceOrView) and the version bumps.
        with inside():
            r = planned(dsts, srcs, non_blocking, strict, bump)
        if r.blocked:
            raise _strict_error(op, native_plan(dsts, srcs))
    stats.record_counts(op, r.paths, r.reasons, time.perf_counter() - start, r.fast, r.fallback)


def _strict_error(op: str, p: Plan) -> FastCopyFallbackError:
    why = p.stock_reason[1] if p.stock_reason else "; ".join(p.reasons[i][1] for i in p.fallback)
    return FastCopyFallbackError(f"npu_dispatch strict: {op} falls back: {why}")


def _native_verify(planned, dsts, srcs, non_blocking, op, strict, bump):
    # Debugging aid: plan first (the lists' errors are stock's) to know whether stock runs the
    # whole call, where there is nothing to compare.
    p = native_plan(list(dsts), list(srcs))
    if strict and p.leaves_fast_path:
        raise _strict_error(op, p)
    v = None
    if bump is None:
        # Stock's rule where the call is made (csrc/planner/copy_call.h), read before the guard below.
        bump = _native.module().foreach_copy_bumps_here(list(dsts))

    def run() -> None:
        nonlocal v
        v = planned(dsts, srcs, non_blocking, False, bump)  # bumps as the native path does

    with inside(), torch._C._AutoDispatchBelowADInplaceOrView():
        if p.stock_reason is None:
            _verify(p, dsts, srcs, non_blocking, run)
        else:
            run()
    return v


def all_gather_copy_in(
    all_gather_inputs: Sequence[torch.Tensor],
    all_gather_output: torch.Tensor,
    inp_split_sizes: Sequence[int],
    all_gather_input_numel: int,
    rank: int,
    *,
    stats: CopyStats,
    op: str,
    strict: bool = False,
    verify: bool = False,
    bump: bool | None = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FSDP2's copy-in, ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``
    ``all_gather_copy_in``, through csrc/planner/copy_call.h: narrows ``all_gather_output`` (1-D,
    ``world_size * all_gather_input_numel`` elements) to this rank's slice, splits it by
    ``inp_split_sizes`` and copies ``all_gather_inputs`` (1-D shards) into the splits. Returns
    ``(all_gather_input, all_gather_output)``; the first is a view of the second. Narrow and split
    raise stock's errors, before anything is written. ``bump``: as for :func:`foreach_copy` (each
    split of the output moves the output's counter once).
    """
    args = (list(all_gather_inputs), all_gather_output, list(inp_split_sizes), all_gather_input_numel, rank)
    module = _native.module()
    if module is None:
        with inside():  # counted here, not again as aten's _foreach_copy_
            result = _stock_all_gather_copy_in(*args)
        stats.record_no_native(op, len(all_gather_inputs))
        return result
    start = time.perf_counter()
    ref = None
    # An input in the output's storage reads what the call writes: stock's own op runs it, and
    # stock's result is the only reference (a clone of the output would not be what it reads).
    if verify and not any(_same_storage(t, all_gather_output) for t in all_gather_inputs):
        ref = _reference([all_gather_output])[0]
        with inside(), module.StockCall():  # stock's op, which an entered NpuFastCopyMode would serve
            _stock_all_gather_copy_in(args[0], ref, *args[2:])
    # The slice carries autograd view metadata (``_base``, a shared version counter) where
    # ADInplaceOrView is in reach, as stock's does there (the debugging mode's handler gets it back
    # where the caller had it).
    with inside():
        all_gather_input, all_gather_output, v = module.all_gather_copy_in(*args, strict, bump)
    _checked(op, v, stats, start)
    if ref is not None:
        _compare(op, [all_gather_output], [ref])
    return all_gather_input, all_gather_output


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a wrapper subclass)
        return False


def _stock_all_gather_copy_in(*args):
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  registers fsdp::all_gather_copy_in
    return torch.ops.fsdp.all_gather_copy_in.default(*args)


def _reason_text(reasons: dict) -> str:
    return ", ".join(sorted(reasons)) or "unknown"


def _checked(op: str, r, stats: CopyStats, start: float) -> None:
    if r.blocked:
        raise FastCopyFallbackError(f"npu_dispatch strict: {op} falls back: {_reason_text(r.reasons)}")
    stats.record_counts(op, r.paths, r.reasons, time.perf_counter() - start, r.fast, r.fallback)


def _compare(op: str, got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        if not torch.equal(_bits(g), _bits(w)):
            raise FastCopyMismatchError(f"npu_dispatch verify: out[{i}] of {op} differs bitwise from stock")


def split_with_sizes_copy(
    all_gather_output: torch.Tensor,
    all_gather_input_split_sizes: Sequence[int],
    dim: int,
    out: Sequence[torch.Tensor],
    *,
    stats: CopyStats,
    op: str,
    strict: bool = False,
    verify: bool = False,
    bump: bool | None = True,
) -> None:
    """FSDP2's all-gather copy-out, ``torch.split_with_sizes_copy(all_gather_output, sizes, dim,
    out=out)``, through csrc/fsdp/copies.h: served calls in one kernel pass (CPU) or one planned
    ``_foreach_copy_`` of row views (a device); others by stock's op, with its errors, warnings
    and writes. ``bump``: as :func:`foreach_copy` (each ``out[i]`` once)."""
    module = _native.module()
    if module is None:
        with inside():  # counted here, not again as aten's op
            torch.split_with_sizes_copy(all_gather_output, list(all_gather_input_split_sizes), dim, out=list(out))
        stats.record_no_native(op, len(out))
        return
    start = time.perf_counter()
    ref = None
    if verify:
        ref = _reference(out)
        with inside(), module.StockCall():  # stock's op, which an entered NpuFastCopyMode would serve
            torch.split_with_sizes_copy(all_gather_output, list(all_gather_input_split_sizes), dim, out=ref)
    with inside():
        v = module.copy_out(all_gather_output, list(all_gather_input_split_sizes), dim, list(out), strict, bump)
    _checked(op, v, stats, start)
    if ref is not None:
        _compare(op, out, ref)


def chunk_cat(
    tensors: Sequence[torch.Tensor],
    dim: int,
    num_chunks: int,
    out: torch.Tensor,
    *,
    stats: CopyStats,
    op: str,
    strict: bool = False,
    verify: bool = False,
    bump: bool | None = True,
) -> None:
    """FSDP2's reduce-scatter copy-in, ``torch._chunk_cat(tensors, dim, num_chunks, out=out)``,
    through csrc/fsdp/copies.h (padding and the widening cast inside the pass), else stock's op.
    ``bump``: as :func:`foreach_copy` (``out`` once)."""
    module = _native.module()
    if module is None:
        with inside():
            torch._chunk_cat(list(tensors), dim, num_chunks, out=out)
        stats.record_no_native(op, len(tensors))
        return
    start = time.perf_counter()
    ref = None
    if verify:
        ref = _reference([out])
        torch._chunk_cat(list(tensors), dim, num_chunks, out=ref[0])
    with inside():
        v = module.chunk_cat(list(tensors), dim, num_chunks, out, strict=strict, bump=bump, mixed=False)
    _checked(op, v, stats, start)
    if ref is not None:
        _compare(op, [out], ref)


def chunk_cat_mixed_dtype(
    tensors: Sequence[torch.Tensor],
    dim: int,
    num_chunks: int,
    out: torch.Tensor,
    *,
    stats: CopyStats,
    op: str,
    strict: bool = False,
    verify: bool = False,
) -> None:
    """torch 2.15's FSDP2 reduce-scatter copy-in, ``fsdp::chunk_cat_mixed_dtype`` (each input cast to
    ``out``'s dtype, then ``_chunk_cat``), through csrc/fsdp/copies.h, else the op's own kernel.
    Called from the debugging mode's handler, below the op's ADInplaceOrView kernel, which moves
    ``out``'s version counter: nothing here does."""
    module = _native.module()
    start = time.perf_counter()
    ref = None
    if verify:
        ref = _reference([out])
        with inside(), module.StockCall():
            torch.ops.fsdp.chunk_cat_mixed_dtype(list(tensors), dim, num_chunks, out=ref[0])
    with inside():
        v = module.chunk_cat(list(tensors), dim, num_chunks, out, strict=strict, mixed=True)
    _checked(op, v, stats, start)
    if ref is not None:
        _compare(op, [out], ref)


# ---- the debugging mode's handlers (strict / verify), keyed by the op table's wrapper column -----
# (csrc/dispatch/owned_ops.h): handler(mode, op, args, kwargs) with the op's schema arguments.


def _non_blocking(args, kwargs) -> bool:
    return args[2] if len(args) > 2 else kwargs.get("non_blocking", False)


def _serve_foreach_copy(mode, op, args, kwargs):
    foreach_copy(args[0], args[1], _non_blocking(args, kwargs), stats=mode.stats, op=op,
                 strict=mode.strict, verify=mode.verify, bump=mode.bumps(op))


def _serve_foreach_copy_functional(mode, op, args, kwargs):
    # Functional variant (what functionalization emits): fresh outputs laid out as stock lays them
    # (csrc/planner/copy_call.h functional_output), then the in-place copy into them. The
    # debugging modes run only with the native library (mode.py).
    outs = _native.module().functional_outputs(list(args[0]))
    foreach_copy(outs, args[1], _non_blocking(args, kwargs), stats=mode.stats, op=op,
                 strict=mode.strict, verify=mode.verify, bump=False)
    return outs


def _serve_all_gather_copy_in(mode, op, args, kwargs):
    # Views with autograd metadata where stock's narrow and split make them: ADInplaceOrView in
    # reach (__torch_dispatch__ gives it back where the caller had it).
    # The schema's argument names are all_gather_copy_in's parameter names.
    return all_gather_copy_in(*args, **kwargs, stats=mode.stats, op=op, strict=mode.strict, verify=mode.verify,
                              bump=mode.bumps(op))


def _serve_split_with_sizes_copy(mode, op, args, kwargs):
    src, sizes = args[0], args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    split_with_sizes_copy(src, sizes, dim, kwargs["out"], stats=mode.stats, op=op, strict=mode.strict,
                          verify=mode.verify, bump=mode.bumps(op))


def _serve_chunk_cat(mode, op, args, kwargs):
    # Stock's kernel runs with autograd in reach, so _chunk_cat.out raises for an argument that
    # requires grad; a dispatch mode's handler runs below autograd. The calls this handler issues
    # (stock's, where the fast path refuses such a call) get autograd back.
    with _autograd_in_reach():
        chunk_cat(args[0], args[1], args[2], kwargs["out"], stats=mode.stats, op=op, strict=mode.strict,
                  verify=mode.verify, bump=mode.bumps(op))


def _serve_chunk_cat_mixed_dtype(mode, op, args, kwargs):
    chunk_cat_mixed_dtype(args[0], args[1], args[2], kwargs["out"], stats=mode.stats, op=op,
                          strict=mode.strict, verify=mode.verify)


def _autograd_in_reach():
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.AutogradFunctionality)
    return torch._C._ForceDispatchKeyGuard(include, exclude)


HANDLERS = {
    "foreach_copy": _serve_foreach_copy,
    "foreach_copy_functional": _serve_foreach_copy_functional,
    "all_gather_copy_in": _serve_all_gather_copy_in,
    "split_with_sizes_copy": _serve_split_with_sizes_copy,
    "chunk_cat": _serve_chunk_cat,
    "chunk_cat_mixed_dtype": _serve_chunk_cat_mixed_dtype,
}
