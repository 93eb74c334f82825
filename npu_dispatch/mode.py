"""``NpuFastCopyMode``: the fast path for FSDP2's copies, scoped to a ``with`` block.

By default the mode pushes no Python dispatch mode: entering it pushes a scope into PyTorch's
thread-local debug info (csrc/dispatch/mode_scope.h), and the library's C++ kernels at the BackendSelect
dispatch key (csrc/dispatch/intercept.h) serve the owned ops while the scope is set. Every other op
dispatches exactly as with no mode. ``strict`` and ``verify`` are debugging aids and do push a
Python ``TorchDispatchMode`` (:class:`_DebugMode`), which every op of the block then crosses.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type

from . import _native, _op_table, engine, ops  # noqa: F401  ops: registers npu_dispatch::
from . import stats as stats_module
from .stats import CopyStats

__all__ = ["NpuFastCopyMode"]

log = logging.getLogger("npu_dispatch")
aten = torch.ops.aten

def _find(row) -> tuple:
    """``(OpOverload or None, why it is not served or None)`` for an owned op (csrc/dispatch/owned_ops.h
    row): None where this torch has no such op; a reason where its schema is not the row's."""
    if row.namespace == "fsdp":
        if not torch.distributed.is_available():
            return None, None
        importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_collectives")  # defines fsdp::
    packet = getattr(getattr(torch.ops, row.namespace), row.op_name, None)
    if packet is None:
        return None, None
    op = getattr(packet, row.overload or "default", None)
    if op is None:
        return None, None
    return op, None if str(op._schema) == row.schema else f"unsupported {row.qualified} schema {op._schema}"


# Filled on the first NpuFastCopyMode(): finding the FSDP op imports FSDP, which `import
# npu_dispatch` should not pay. id(op) -> (op, handler or None where the op only passes through,
# its row's counted name): the debugging mode's table, keyed by id because OpOverload hashes in
# Python.
_TABLE: dict = {}
# (OpOverload, row) of each intercepted row of the op table whose op this torch has, set by _install.
_INTERCEPTED: list = []
# Why the interception kernels are not used in this process (empty: they are), set by _install.
_NO_INTERCEPTION: list = []

# What the interception kernels rely on in this torch, as checked when they were installed
# (csrc/dispatch/dispatcher_facts.h): (name, holds, detail) per fact. Empty before the first
# NpuFastCopyMode() or without the native library.
FACTS: list = []

# Set to 0 to make NpuFastCopyMode take its Python dispatch-mode path (a debugging aid; the
# semantic tests run that path this way too).
INTERCEPTION_ENV = "NPU_DISPATCH_INTERCEPTION"


def _interception_refused() -> str | None:
    """Why the interception kernels are not used in this process, or None (also None before the
    first NpuFastCopyMode(), which decides)."""
    return _NO_INTERCEPTION[0] if _NO_INTERCEPTION else None


def _check_and_install(module, served: list) -> str | None:
    """Checks the dispatcher facts the interception kernels rely on, installs the kernels where
    they hold and checks a live call; returns why the mode must take its Python path, or None."""
    if os.environ.get(INTERCEPTION_ENV, "1") == "0":
        return f"{INTERCEPTION_ENV}=0"
    facts = [tuple(f) for f in module.static_facts(served)]
    FACTS[:] = facts
    failing = [f for f in facts if not f[1]]
    if failing:
        return f"{failing[0][0]}: {failing[0][2]}"
    module.install(served)
    live = tuple(module.live_fact())
    FACTS.append(live)
    return None if live[1] else f"{live[0]}: {live[2]}"


def _install() -> None:
    """Registers the npu_dispatch ops, and the C++ interception kernels once the native library
    loads (csrc/dispatch/intercept.h); reads FSDP's schema. Once per process."""
    if _TABLE:
        return

    module = _native.module()
    entries = {}  # op -> handler, or None where the op only passes through
    served, passing = [], []
    for row in _op_table.rows():
        op, why = _find(row)
        if op is None:
            continue
        if row.intercepted:
            _INTERCEPTED.append((op, row))
        if row.namespace == "aten":
            why = None  # its schema is a dispatcher fact (csrc/dispatch/dispatcher_facts.h)
        elif row.intercepted:
            if module is None:
                # Without the native library every such op passes through to stock, counted
                # (below), whatever its schema.
                why = "no native library"
            elif why is not None:
                log.warning("npu_dispatch: passing %s through to stock: %s", row.counted, why)
            (served if why is None else passing).append(row.qualified)
        entries[op] = (engine.HANDLERS[row.wrapper] if why is None else None, row.counted)
    refused = _check_and_install(module, served) if module is not None else None
    if refused is not None:
        log.warning("npu_dispatch: NpuFastCopyMode takes the Python dispatch-mode path (a per-op cost): %s", refused)
        _NO_INTERCEPTION.append(refused)
    elif module is not None:
        for qualified in passing:
            module.install_passthrough(qualified)
    else:
        _install_no_native_counters(_INTERCEPTED)
    _TABLE.update({id(op): (op, handler, counted) for op, (handler, counted) in entries.items()})


# ---- without the native library: count, and leave every call to stock ---------------------------

_entered = stats_module.entered  # the NpuFastCopyModes entered on this thread, innermost last
_AFTER_BACKEND_SELECT = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
_KEEP_ALIVE: list = []


def _pairs(args, kwargs) -> int:
    """The pairs of an owned op's call, for its stats, where the native library (which counts
    them: csrc/dispatch/intercept.h ``whole_call_counts``) is missing: the length of its first
    tensor list in schema order (the copy-out's ``out``, chunk_cat's ``tensors``, a foreach
    copy's ``self``), 1 where it has none."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in a):
            return len(a)
    return 1


def _install_no_native_counters(owned) -> None:
    """Python kernels at BackendSelect for the owned ops, registered only where the native library
    is missing: inside an entered mode each call is counted (reason ``no_native``; ``strict``
    raises instead, before anything is written), and every call goes on below BackendSelect
    unchanged, so results and version counters are stock's.
    Other ops are untouched; the owned ops pay one Python call each, in the block or not. Calls
    on threads other than the entering one are not counted (a Python thread-local holds the
    modes)."""
    libs: dict = {}
    for op, row in owned:
        ns = row.namespace
        if ns not in libs:
            libs[ns] = torch.library.Library(ns, "IMPL")
        name = row.counted

        def kernel(keyset, *args, op=op, name=name, **kwargs):
            modes = _entered()
            if modes and not engine.busy():
                if modes[-1].strict:
                    raise engine.no_native_error(name)
                modes[-1].stats.record_no_native(name, _pairs(args, kwargs))
                with engine.inside():  # counted: an owned op the kernel calls is not counted again
                    return op.redispatch(keyset & _AFTER_BACKEND_SELECT, *args, **kwargs)
            return op.redispatch(keyset & _AFTER_BACKEND_SELECT, *args, **kwargs)

        libs[ns].impl(row.qualified.split("::", 1)[1], kernel, "BackendSelect", with_keyset=True)
    _KEEP_ALIVE.extend(libs.values())


def _infra_mode_below(get=torch._C._get_dispatch_mode, proxy=torch._C._TorchDispatchModeKey.PROXY,
                      fake=torch._C._TorchDispatchModeKey.FAKE,
                      functional=torch._C._TorchDispatchModeKey.FUNCTIONAL) -> bool:
    """Whether an infra dispatch mode (proxy, fake, functional: always below the user modes) is
    set on this thread."""
    return get(proxy) is not None or get(fake) is not None or get(functional) is not None


class _DebugMode(TorchDispatchMode):
    """The Python dispatch mode ``strict`` / ``verify`` need (native library loaded). Every op of
    the block crosses ``__torch_dispatch__`` (a few microseconds each: docs/benchmarks.md,
    mode_overhead)."""

    def __init__(self, owner: "NpuFastCopyMode") -> None:
        super().__init__()
        self.owner = owner
        self.stats = owner.stats
        self.strict = owner.strict
        self.verify = owner.verify
        # Whether stock's call would bump the destinations: this handler runs with ADInplaceOrView
        # excluded whatever the caller did, so a kernel at that key notes it (csrc/dispatch/intercept.h).
        module = _native.module()
        self._in_reach = module.in_reach_modes if module is not None else None
        self._marked = set()
        # The intercepted ops with an ADInplaceOrView kernel of their own, which moves the counters.
        self._own_bumps = set()
        if module is not None:
            for op, row in _INTERCEPTED:
                if module.install_in_reach_marker(row.qualified):
                    self._marked.add(row.counted)
                else:
                    self._own_bumps.add(row.counted)

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def bumps(self, op: str) -> bool | None:
        """The engine's ``bump`` for ``op``: None (stock's rule where the call is made, read from
        this thread's dispatch keys, which __torch_dispatch__ sets back to the caller's for a
        marked op), False where the op's own ADInplaceOrView kernel moves the counters, or, for
        the library's own ops, True."""
        if op in self._marked:
            return None
        return op not in self._own_bumps

    def other_modes(self, op: str) -> bool:
        """Whether a Python dispatch mode other than the library's own was on the stack when the
        call was made (and ADInplaceOrView in reach, which the marker needs to see it)."""
        if op not in self._marked:
            return False
        own = sum(1 for m in _entered() if isinstance(m._backend, _DebugBackend))
        return self._in_reach() > own

    def _passthrough(self, func, name, why, args, kwargs) -> None:
        """Count a call handed to stock whole, as the C++ interception counts its passthroughs."""
        r = _native.module().passthrough_counts(func.name(), why, *args, **kwargs)
        self.stats.record_counts(name, r.paths, r.reasons, 0.0, r.fast, r.fallback)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        entry = _TABLE.get(id(func))
        kwargs = kwargs or {}
        modes = _entered()
        if entry is None or engine.busy() or (modes and modes[-1] is not self.owner):
            # Not owned, a stock call issued by the engine of a mode nested inside this one, or a
            # call of a default mode entered inside this one on this thread (its kernels serve it
            # below). On threads that entered no mode (autograd's) this mode handles it.
            return func(*args, **kwargs)
        _, handler, name = entry
        if handler is None:
            self._passthrough(func, name, "schema", args, kwargs)
            return func(*args, **kwargs)
        if torch._C._len_torch_dispatch_stack() and _infra_mode_below():
            # make_fx's proxy mode (tracing_mode="real"), FakeTensorMode or functionalization sits
            # below every user mode and must see the op itself to record it.
            self._passthrough(func, name, "infra_mode", args, kwargs)
            return func(*args, **kwargs)
        if types and any(t is not torch.Tensor for t in types):
            if all(t is torch.Tensor or is_traceable_wrapper_subclass_type(t) for t in types):
                # A wrapper subclass (DTensor, TwoTensor...) unwraps itself; the plain-tensor
                # copies it issues come back to this mode and are counted then, as the C++
                # interception counts only them.
                return NotImplemented
            self._passthrough(func, name, "subclass", args, kwargs)
            return func(*args, **kwargs)
        if self.other_modes(name):
            # Another Python dispatch mode was on the stack at the call: without this one, the
            # call would reach it, and its handler's own call run below ADInplaceOrView.
            self._passthrough(func, name, "dispatch_mode", args, kwargs)
            return func(*args, **kwargs)
        if name in self._marked and self._in_reach() >= 0:
            # The caller had ADInplaceOrView in reach: so does the work done for it here, as at
            # BackendSelect where the C++ interception serves the call (views, version bumps).
            include = torch._C._dispatch_tls_local_include_set()
            exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.ADInplaceOrView)
            with torch._C._ForceDispatchKeyGuard(include, exclude):
                return handler(self, name, args, kwargs)
        return handler(self, name, args, kwargs)


def _free_scope(module, scope: int, stats: CopyStats) -> None:
    _native.fold_counters(stats, module.scope_drain(scope))
    module.scope_free(scope)


# ---- the three ways a mode serves its block, one chosen per mode ---------------------------------


class _ScopeBackend:
    """The default: a scope in c10::ThreadLocalDebugInfo, read by the C++ interception kernels
    (csrc/dispatch/mode_scope.h). No Python on any op's path."""

    def __init__(self, mode: "NpuFastCopyMode", module) -> None:
        self.module = module
        self.scope = module.scope_new()
        # Counts still in C++ reach the stats before the scope goes, even when the mode object
        # is dropped while its stats live on.
        weakref.finalize(mode, _free_scope, module, self.scope, mode.stats)

        def drain(stats, module=module, scope=self.scope):
            _native.fold_counters(stats, module.scope_drain(scope))

        mode.stats.add_source(drain)

    def enter(self) -> None:
        self.module.scope_enter(self.scope)

    def exit(self, *exc) -> None:
        self.module.scope_exit(self.scope)


class _CountedBackend:
    """Without the native library: stock runs every owned op, counted by the Python kernels of
    _install_no_native_counters; nothing is pushed."""

    def enter(self) -> None:
        pass

    def exit(self, *exc) -> None:
        pass


class _DebugBackend:
    """``strict`` / ``verify``, or the interception refused in this process: a :class:`_DebugMode`
    pushed per entry."""

    def __init__(self, mode: "NpuFastCopyMode") -> None:
        self.mode = mode
        self._local = threading.local()  # .pushed: this thread's _DebugModes, innermost last

    def _pushed(self) -> list:
        if not hasattr(self._local, "pushed"):
            self._local.pushed = []
        return self._local.pushed

    def enter(self) -> None:
        debug = _DebugMode(self.mode)
        debug.__enter__()
        self._pushed().append(debug)

    def exit(self, *exc) -> None:
        self._pushed().pop().__exit__(*exc)


class NpuFastCopyMode(contextlib.ContextDecorator):
    """Serves the owned ops (the rows of csrc/dispatch/owned_ops.h: ``aten._foreach_copy_``,
    FSDP2's copy ops and the aten op its copy-out calls) with the library's planner inside a
    ``with`` block.

    Results, errors and version-counter bumps are those of the stock ops without a mode, bit for
    bit (NaN payloads and -0.0 included). Every other op costs what it costs with no mode: by
    default nothing is put on the Python dispatch stack.

    How: entering pushes a scope into ``c10::ThreadLocalDebugInfo`` (csrc/dispatch/mode_scope.h), which
    PyTorch carries to the threads it runs work on for this thread: the autograd engine's device
    threads (FSDP2's backward hooks and their all-gathers), ``torch.jit.fork``/``at::launch``. The
    library's C++ kernels at the BackendSelect key (csrc/dispatch/intercept.h) read it; without it they
    redispatch unchanged. Threads the block starts itself (``threading.Thread``) are not covered.
    Calls are counted in ``stats`` of the mode whose scope the calling thread carries (the
    innermost entered), whatever thread makes them.

    Args:
        strict: raise :class:`npu_dispatch.FastCopyFallbackError`, naming the reason, before any
            call that would leave the fast path (nothing is written then).
        verify: also run the stock op on copies of the destinations and raise
            :class:`npu_dispatch.FastCopyMismatchError` on any bitwise difference.

    ``strict`` and ``verify`` push a Python ``TorchDispatchMode``, so every op of the block crosses
    Python (a few microseconds each). It hands ops to stock unchanged while an infra dispatch mode
    is set below it (``infra_mode``) and lets tensor subclasses unwrap first (``subclass``); its
    ``ignore_compile_internals()`` is True, so ``torch.compile`` still compiles inside it.

    Without the native library (no compiler, a failed build: ``python -m npu_dispatch doctor``
    says why) every owned op goes to stock, and the calls of the entering thread are counted with
    reason ``no_native``; no Python mode is pushed, so other ops still pay nothing. ``strict``
    then raises for every owned op, and ``verify`` has nothing to compare.

    ``stats`` (:class:`npu_dispatch.CopyStats`) counts calls, pairs, bytes and device launches per
    op and path, and fallbacks by reason; ``stats.report()`` renders them. Entries nest; exit in
    the reverse order of entry, on the entering thread (``RuntimeError`` otherwise).

    A mode is also a decorator (``contextlib.ContextDecorator``): ``@NpuFastCopyMode()`` on a
    training step puts every call of it (forward, backward, optimizer step) under the one mode,
    whose ``stats`` add up over the calls.
    """

    def __init__(self, strict: bool = False, verify: bool = False) -> None:
        _install()
        self.strict = bool(strict)
        self.verify = bool(verify)
        self.stats = CopyStats()
        module = _native.module()
        if module is None:
            self._backend = _CountedBackend()
        elif self.strict or self.verify or _NO_INTERCEPTION:
            self._backend = _DebugBackend(self)
        else:
            self._backend = _ScopeBackend(self, module)

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """True: compiling inside the block is never skipped (the default mode pushes no
        dispatch mode at all; the debugging one declares itself compile-transparent)."""
        return True

    def __enter__(self) -> "NpuFastCopyMode":
        self._backend.enter()
        _entered().append(self)
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        modes = _entered()  # this thread's entries: a mode may be entered on several threads
        if not any(m is self for m in modes):
            raise RuntimeError("NpuFastCopyMode exited more often than it was entered")
        if not modes or modes[-1] is not self:
            raise RuntimeError("NpuFastCopyMode exited out of order: exit modes in the reverse order of entry, "
                               "on the thread that entered them")
        self._backend.exit(exc_type, exc_value, traceback)
        modes.pop()
        return False
