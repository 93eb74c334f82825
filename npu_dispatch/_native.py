"""The C++ library in ``csrc/`` as the rest of the package uses it: loaded once (``_loader``: the
install-time build, else a first-use build, then cached), checked, and handed the capability table.

It holds:

- C++ kernels for the ``npu_dispatch::`` ops at CPU, CUDA and PrivateUse1 (they win over the
  Python CompositeExplicitAutograd kernels of ``ops.py``) and, once ``install()`` is called
  (``NpuFastCopyMode``'s first use), the interception kernels at BackendSelect (csrc/dispatch/intercept.h);
- its Python functions (csrc/binding/module.cpp, pybind11; the hot direct entries hand-written in
  csrc/binding/direct_entry.cpp): ``foreach_copy_planned`` (checks, plan, copy;
  the debugging mode's and the ops' Python kernels' entry), ``foreach_copy_direct`` (the public
  ``foreach_copy_``'s one-pass plan), ``plan`` (for ``explain``), the mode scopes (``scope_*``),
  ``names`` / ``info`` / ``self_check`` / ``drain_stats`` / ``set_capabilities``. Plans, counts
  and counters cross as named Python objects (csrc/binding/to_python.h), with the names C++
  defines (``names()``).

Without a compiler, or when the build fails, or with ``NPU_DISPATCH_NATIVE=0``, the reason is
logged once, ``status()`` reports it, and every copy runs as stock, counted as ``no_native``.

The capability table stays Python data: ``capabilities`` tells this module whenever the table in
force changes (override enter and exit) and the whole table is pushed to C++; the npu entry is
pushed again once torch_npu gets imported.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time

import torch

from . import _build, _loader, capabilities, stats as _stats

__all__ = ["load", "available", "status", "build", "module", "planned_op", "direct_op", "self_check_result", "info",
           "names"]

log = logging.getLogger("npu_dispatch")

_lock = threading.RLock()
_tried = False
_reason = "not loaded yet"
_module = None  # the loaded extension module
_planned = None  # its foreach_copy_planned, the engine's per-call entry
_direct = None  # its foreach_copy_direct, the public foreach_copy_'s one-pass plan
_self_check: dict | None = None
_names: dict | None = None
_npu_pending = False  # pushed before torch_npu was imported: push again once it is
_build_seconds: float | None = None


def status() -> tuple[bool, str]:
    """``(built, reason)``: whether the native library is loaded, and why not (or how)."""
    return _planned is not None, _reason


def self_check_result() -> dict | None:
    """Which CPU conversions the kernel matched stock on at load, and with which variant:
    ``{conversion: {"enabled", "variant", "fbgemm_split"}}`` (csrc/cpu/copy_kernel.h)."""
    return _self_check


def names() -> dict | None:
    """The names the C++ core defines (csrc/binding/to_python.h): ``kinds``, ``paths``,
    ``fast_paths``, ``off_fast_paths``, ``counted_ops`` (the op table's rows, csrc/dispatch/owned_ops.h);
    None without the native library."""
    load()
    return _names


def info() -> dict:
    """Counters only the C++ side moves: one-pass CPU kernel runs, work items, destination bytes,
    the destination bytes of the copies made with streaming stores (passes beyond the cache,
    csrc/cpu/byte_copy.h), calls that took the one-pass plan (csrc/planner/one_pass.h) instead
    of the full planner; the bytes read plus written from which a pass streams
    (``stream_moved_bytes``: the last-level cache's size, at most 96 MiB); and the seconds it took
    to build or load."""
    if _planned is None:
        return {}
    return {**_module.info(), "build_seconds": _build_seconds}


def module():
    """The loaded extension module (``plan``, ``foreach_copy_planned``), or None."""
    load()
    return _module


def planned_op():
    """``foreach_copy_planned(dsts, srcs, non_blocking, strict, bump) -> CallResult``
    (csrc/planner/execute.h, bound in csrc/binding/to_python.cpp), or None (no native library).
    O(1) after the first call."""
    if _planned is not None:
        if _npu_pending and "torch_npu" in sys.modules:
            push_capabilities()
        return _planned
    if _tried:
        return None
    return load()


def direct_op():
    """``foreach_copy_direct(dsts: list, srcs: list, non_blocking) -> bool``, or None: the fast
    one-pass plan of the public ``foreach_copy_`` (csrc/binding/direct_entry.cpp). True when the copy was done
    and counted; False, with nothing written, when the general path must take the call. The
    one-pass plan takes CPU tensors only, so the npu capability entry never matters to it."""
    if _direct is None and not _tried:
        load()
    return _direct


def load():
    """Build (first time) and load the library; returns the planned-op callable or None."""
    global _tried
    if _tried:
        return _planned
    with _lock:
        if _tried:
            return _planned
        try:
            _load()
        finally:
            _tried = True
    return _planned


def build(verbose: bool = True) -> tuple[bool, str]:
    """Build and load now (for ``python -m npu_dispatch build``); returns ``status()``."""
    global _tried
    with _lock:
        if not _tried:
            try:
                _load(verbose=verbose)
            finally:
                _tried = True
    return status()


def _load(verbose: bool = False) -> None:
    global _reason, _planned, _self_check, _build_seconds, _module, _direct, _names
    if os.environ.get("NPU_DISPATCH_NATIVE", "1") == "0":
        _reason = "disabled by NPU_DISPATCH_NATIVE=0"
        return
    start = time.perf_counter()
    try:
        module, how = _loader.load(_build.LIBRARY, verbose)
    except _loader.LoadError as e:
        _fail(str(e))
        return
    try:
        _self_check = module.self_check()
        _names = module.names()
    except Exception as e:  # noqa: BLE001  a library that fails its checks is not used
        _fail(f"{type(e).__name__}: {e}")
        return
    _build_seconds = time.perf_counter() - start
    # The C++ CPU kernel copies every CPU group of a call in one pass: one launch per group,
    # where ATen's CPU _foreach_copy_ issues one copy_ per tensor; it takes the dtype pairs it
    # copies as stock does (its self-check decides), the rest stay stock's copy_ pair by pair.
    cpu = capabilities.lookup_default("cpu")
    pairs = module.kernel_pairs()
    capabilities.set_default("cpu", dataclasses.replace(
        cpu, dtypes=frozenset(s for s, d in pairs if s == d), cross_pairs=frozenset((s, d) for s, d in pairs if s != d),
        max_tensors_per_launch=1 << 30, host_pass=True, source="npu_dispatch multi-tensor CPU kernel (csrc/)"))
    _module = module
    _stats.set_paths(_names["paths"])
    capabilities.on_change(push_capabilities)
    push_capabilities()
    _stats.add_drain(_drain_into)
    _planned = module.foreach_copy_planned
    _direct = module.foreach_copy_direct
    _reason = f"loaded {how} ({_build_seconds:.1f}s to build or load)"


def _fail(reason: str) -> None:
    global _reason
    _reason = f"native library unavailable, every copy runs as stock (no_native): {reason}"
    log.warning("npu_dispatch: %s", _reason)


def push_capabilities() -> None:
    """Send the table in force to C++ (planner/capability_table.h): one Capability per device type."""
    global _npu_pending
    merged = dict(capabilities.table())
    pending = False
    if "npu" not in capabilities._table and not any("npu" in layer for layer in capabilities._overrides):
        if "torch_npu" in sys.modules:
            merged["npu"] = capabilities.lookup("npu")  # the entry capabilities.lookup caches on first sight
        else:
            pending = True
    entries = []
    for name, cap in merged.items():
        native = None
        if cap is not None:
            native = _module.Capability()
            native.whole_list_only = cap.whole_list_only
            native.host_pass = cap.host_pass
            native.batched_transfers = cap.batched_transfers
            native.batched_keeps_versions = cap.batched_keeps_versions
            native.max_per_launch = cap.max_tensors_per_launch or 0
            native.stage_bytes = cap.stage_bytes
            # None: every dtype (pair) the C++ rule lets leave stock.
            native.allow_copy_dtypes(cap.dtypes is None, cap.cross_pairs is None)
            for d in cap.dtypes or ():
                native.allow(d, d)
            for s, d in cap.cross_pairs or ():
                native.allow(s, d)
        entries.append((name, native))
    _module.set_capabilities(entries)
    _npu_pending = pending


def _drain_into(stats: "_stats.CopyStats") -> None:
    fold_counters(stats, _module.drain_stats())


def fold_counters(stats: "_stats.CopyStats", drained: dict | None) -> None:
    """Add counters C++ kept (csrc/binding/to_python.h ``totals``: op -> {calls, fast_calls,
    fallback_calls, seconds, paths, fallbacks}; None or empty: nothing) to ``stats``."""
    for op, totals in (drained or {}).items():
        stats.add_totals(op, **totals)


_stats.set_path_source(load)


def available() -> bool:
    """Whether copies take the native path (builds the library on first call)."""
    return load() is not None
