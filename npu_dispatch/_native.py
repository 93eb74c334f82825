"""Loader for the C++ library in ``csrc/`` (JIT-built on first use, then cached).

``load()`` uses the extension ``pip install --no-build-isolation`` built (``npu_dispatch/_C``,
``setup.py``) when it was built from the sources next to the package and for the torch in use;
else it builds one with ``torch.utils.cpp_extension.load`` into ``TORCH_EXTENSIONS_DIR`` (default
``~/.cache/torch_extensions``) the first time a copy needs it, saying so on stderr, and later
processes reuse the cached library. It holds:

- C++ kernels for the ``npu_dispatch::`` ops at CPU, CUDA and PrivateUse1 (they win over the
  Python CompositeExplicitAutograd kernels of ``ops.py``) and, once ``install()`` is called
  (``NpuFastCopyMode``'s first use), the interception kernels at BackendSelect (csrc/intercept.h);
- CPython functions: ``foreach_copy_planned`` (checks, plan, copy; the debugging mode's and the
  ops' Python kernels' entry), ``foreach_copy_direct`` (the public ``foreach_copy_``'s fast
  lane), ``plan`` (the plan as ints, for ``explain``), the mode scopes (``scope_*``), and
  ``info`` / ``self_check`` / ``drain_stats`` / ``set_capabilities``.

Without a compiler, or when the build fails, or with ``NPU_DISPATCH_NATIVE=0``, the reason is
logged once, ``status()`` reports it, and every copy runs as stock, counted as ``no_native``.

The capability table stays Python data: ``capabilities`` tells this module whenever the table in
force changes (override enter and exit) and the whole table is pushed to C++; the npu entry is
pushed again once torch_npu gets imported.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import torch

from . import _build, capabilities, stats as _stats

__all__ = ["load", "available", "status", "build", "module", "planned_op", "direct_op", "self_check_result", "info"]

log = logging.getLogger("npu_dispatch")

_BASE_NAME = "npu_dispatch_native"
_ABI_VERSION = 14
def _build_name(src: Path) -> str:
    """One cache entry per source tree and torch build: two checkouts (or venvs) sharing
    TORCH_EXTENSIONS_DIR would otherwise rebuild over each other on every load."""
    key = f"{src.resolve()}|{torch.__version__}|{torch.__file__}".encode()
    return f"{_BASE_NAME}_{hashlib.sha1(key).hexdigest()[:10]}"


_lock = threading.RLock()
_tried = False
_reason = "not loaded yet"
_module = None  # the loaded extension module
_planned = None  # its foreach_copy_planned, the engine's per-call entry
_direct = None  # its foreach_copy_direct, the public foreach_copy_'s fast lane
_self_check: list[int] | None = None
_npu_pending = False  # pushed before torch_npu was imported: push again once it is
_build_seconds: float | None = None


def _source_dir() -> Path | None:
    return _build.source_dir(Path(__file__).resolve().parent)


def status() -> tuple[bool, str]:
    """``(built, reason)``: whether the native library is loaded, and why not (or how)."""
    return _planned is not None, _reason


def self_check_result() -> dict | None:
    """Which CPU conversions the kernel matched stock on at load, and with which variant."""
    if _self_check is None:
        return None
    names = ("f32->bf16", "bf16->f32", "f32->f16", "f16->f32")
    variants = ("none", "DEFAULT", "AVX2", "AVX512")
    sc = _self_check
    return {
        n: {"enabled": bool(sc[1 + k]), "variant": variants[sc[5 + k]], "fbgemm_split": bool(sc[9 + k])}
        for k, n in enumerate(names)
    }


def info() -> dict:
    """Counters only the C++ side moves: one-pass CPU kernel runs, work items, destination bytes,
    the destination bytes of the copies made with streaming stores (passes beyond the cache,
    csrc/stream_copy.h), calls that took the fast lane (csrc/fast_lane.h) instead of the full
    planner, and those of them whose checks were split across threads (csrc/sharded_lane.h); and
    the bytes read plus written from which a pass streams (``stream_moved_bytes``: the last-level
    cache's size, at most 96 MiB)."""
    if _planned is None:
        return {}
    abi, passes, items, nbytes, streamed, lane, sharded, stream_at = _module.info()
    return {"abi": abi, "kernel_passes": passes, "kernel_items": items, "kernel_bytes": nbytes,
            "kernel_streamed_bytes": streamed, "fast_lane_calls": lane, "sharded_lane_calls": sharded,
            "stream_moved_bytes": stream_at, "build_seconds": _build_seconds}


def module():
    """The loaded extension module (``plan``, ``foreach_copy_planned``), or None."""
    load()
    return _module


def planned_op():
    """``foreach_copy_planned(dsts, srcs, non_blocking, strict, bump) -> tuple[int, ...]``, or
    None (no native library). O(1) after the first call."""
    if _planned is not None:
        if _npu_pending and "torch_npu" in sys.modules:
            push_capabilities()
        return _planned
    if _tried:
        return None
    return load()


def direct_op():
    """``foreach_copy_direct(dsts: list, srcs: list, non_blocking) -> bool``, or None: the fast
    lane of the public ``foreach_copy_`` (csrc/python_entry.cpp). True when the copy was done
    and counted; False, with nothing written, when the general path must take the call. The
    lane takes CPU tensors only, so the npu capability entry never matters to it."""
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
    global _reason, _planned, _self_check, _build_seconds, _module, _direct
    if os.environ.get("NPU_DISPATCH_NATIVE", "1") == "0":
        _reason = "disabled by NPU_DISPATCH_NATIVE=0"
        return
    src = _source_dir()
    start = time.perf_counter()
    module, how = _installed_build(src)
    if module is None:
        if src is None:
            _fail("C++ sources (csrc/*.cpp) not found next to the package")
            return
        cxx = os.environ.get("CXX", "c++")
        if shutil.which(cxx) is None:
            _fail(f"no C++ compiler: {cxx!r} not found (install one, or set CXX); {how}")
            return
        try:
            module, how = _first_use_build(src, verbose)
        except Exception as e:  # no compiler, failed build, failed load: stock serves (no_native)
            _fail(f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
            return
    try:
        abi = module.info()[0] if hasattr(module, "info") else None
        if abi != _ABI_VERSION:
            _fail(f"stale native library (ABI {abi}, expected {_ABI_VERSION})")
            return
        _self_check = list(module.self_check())
    except Exception as e:  # noqa: BLE001  a library that fails its checks is not used
        _fail(f"{type(e).__name__}: {e}")
        return
    _build_seconds = time.perf_counter() - start
    # The C++ CPU kernel copies every CPU group of a call in one pass: one launch per group,
    # where ATen's CPU _foreach_copy_ issues one copy_ per tensor.
    cpu = capabilities.lookup_default("cpu")
    capabilities.set_default("cpu", dataclasses.replace(
        cpu, max_tensors_per_launch=1 << 30, host_pass=True, source="npu_dispatch multi-tensor CPU kernel (csrc/)"))
    _module = module
    capabilities.on_change(push_capabilities)
    push_capabilities()
    _stats.add_drain(_drain_into)
    _planned = module.foreach_copy_planned
    _direct = module.foreach_copy_direct
    _reason = f"loaded {how} ({_build_seconds:.1f}s to build or load)"


def _installed_build(src: Path | None):
    """``(module, how)``: the extension an install built (``npu_dispatch/_C``), where it was built
    from the sources next to the package and for this torch; else ``(None, why not)``. A stale
    one is never imported (its kernels would register beside the fresh build's)."""
    here = Path(__file__).resolve().parent
    info_file = here / _build.BUILD_INFO
    if not info_file.is_file():
        return None, "no extension was built at install"
    try:
        info = json.loads(info_file.read_text())
    except (OSError, ValueError) as e:
        return None, f"unreadable {info_file.name}: {e}"
    if info.get("torch") != torch.__version__:
        return None, f"the extension installed was built for torch {info.get('torch')}, not {torch.__version__}"
    if src is not None and info.get("source_hash") != _build.source_hash(src):
        return None, "the extension installed was built from other sources than those next to the package"
    try:
        return importlib.import_module(_build.EXTENSION), f"{_build.EXTENSION} (built at install)"
    except ImportError as e:
        return None, f"the extension installed does not load: {e}"


def _first_use_build(src: Path, verbose: bool):
    """Builds (or loads the cached build of) the extension with torch.utils.cpp_extension.load;
    says so on stderr before and after a build that has no cached library yet (``verbose``, as
    ``python -m npu_dispatch build`` passes: every compiler step too)."""
    from torch.utils import cpp_extension

    name = _build_name(src)
    cached = Path(cpp_extension._get_build_directory(name, verbose=False)) / f"{name}.so"
    fresh = not cached.is_file()
    if fresh:
        print(f"npu_dispatch: building the C++ extension for torch {torch.__version__} now (first use; "
              "`pip install --no-build-isolation .` builds it at install, `python -m npu_dispatch build` "
              "ahead of time)", file=sys.stderr, flush=True)
    omp_cflags, omp_ldflags = _build.openmp_flags(torch)
    start = time.perf_counter()
    module = cpp_extension.load(
        name=name,
        sources=[str(p) for p in _build.sources(src)],
        extra_cflags=_build.CFLAGS + omp_cflags,
        extra_ldflags=omp_ldflags,
        is_python_module=True,
        verbose=verbose,
    )
    if fresh:
        print(f"npu_dispatch: built the C++ extension in {time.perf_counter() - start:.0f} s", file=sys.stderr,
              flush=True)
    return module, name


def _fail(reason: str) -> None:
    global _reason
    _reason = f"native library unavailable, every copy runs as stock (no_native): {reason}"
    log.warning("npu_dispatch: %s", _reason)


def push_capabilities() -> None:
    """Send the table in force to C++ (names, flat int table, dtypes; see capability_table.h)."""
    global _npu_pending
    merged = dict(capabilities.table())
    pending = False
    if "npu" not in capabilities._table and not any("npu" in layer for layer in capabilities._overrides):
        if "torch_npu" in sys.modules:
            merged["npu"] = capabilities.lookup("npu")  # what plan.py's first sight would cache
        else:
            pending = True
    names: list[str] = []
    table: list[int] = []
    dtypes: list[torch.dtype] = []
    index: dict[torch.dtype, int] = {}

    def idx(dt: torch.dtype) -> int:
        if dt not in index:
            index[dt] = len(dtypes)
            dtypes.append(dt)
        return index[dt]

    for name, cap in merged.items():
        names.append(name)
        if cap is None:
            table += [0, 0, 0, 0]
            continue
        pairs = [(d, d) for d in sorted(cap.dtypes, key=str)] + sorted(cap.cross_pairs, key=str)
        flags = (1 | (2 if cap.whole_list_only else 0) | (4 if cap.host_pass else 0)
                 | (8 if cap.batched_transfers else 0) | (16 if cap.batched_keeps_versions else 0))
        table += [flags, cap.max_tensors_per_launch or 0, cap.stage_bytes,
                  len(pairs)]
        for s, d in pairs:
            table += [idx(s), idx(d)]
    _module.set_capabilities(names, table, dtypes)
    _npu_pending = pending


# Layout of the counters C++ keeps (drain_stats, scope_drain: csrc/native_stats.h).
_COUNTED_OPS = ("npu_dispatch.foreach_copy_", "npu_dispatch.all_gather_copy_in", "aten._foreach_copy_",
                "aten._foreach_copy", "fsdp.all_gather_copy_in", "npu_dispatch.split_with_sizes_copy",
                "npu_dispatch.chunk_cat", "fsdp.split_with_sizes_copy", "fsdp.chunk_cat",
                "fsdp.chunk_cat_mixed_dtype")


def _drain_into(stats: "_stats.CopyStats") -> None:
    fold_counters(stats, _module.drain_stats())


def fold_counters(stats: "_stats.CopyStats", v) -> None:
    """Add counters C++ kept (csrc/native_stats.h layout; None or all zero: nothing) to ``stats``."""
    from ._native_plan import KINDS

    if not v or not any(v):
        return
    pos = 0
    for op in _COUNTED_OPS:
        calls, fast, fallback, ns = v[pos:pos + 4]
        pos += 4
        paths = {}
        for p in _stats.PATHS:
            if v[pos]:
                paths[p] = tuple(v[pos:pos + 4])
            pos += 4
        fallbacks = {}
        for kind in KINDS:
            if v[pos]:
                fallbacks[kind] = (v[pos], v[pos + 1])
            pos += 2
        if calls:
            stats.add_totals(op, calls, fast, fallback, ns * 1e-9, paths, fallbacks)


def available() -> bool:
    """Whether copies take the native path (builds the library on first call)."""
    return load() is not None
