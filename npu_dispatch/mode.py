"""``NpuFastCopyMode``: a TorchDispatchMode that routes foreach copies and FSDP copy-in to the planner.

Per op the mode does one dict lookup; ops it does not own go straight to ``func``. With the native
library, plain ``aten._foreach_copy_`` calls never reach Python: its dispatch route
(csrc/mode_route.h) copies them at the first dispatch key they meet.
"""
from __future__ import annotations

import importlib
import logging
import time
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import (TorchDispatchMode, _get_current_dispatch_mode,
                                          is_traceable_wrapper_subclass_type)

from . import _native, engine
from ._native_plan import decode_counts
from .stats import CopyStats

__all__ = ["NpuFastCopyMode"]

log = logging.getLogger("npu_dispatch")
aten = torch.ops.aten

_FSDP_SCHEMA = ("all_gather_inputs", "all_gather_output", "inp_split_sizes", "all_gather_input_numel", "rank")


def _foreach_copy_(mode, op, args, kwargs):
    dsts, srcs = args[0], args[1]
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    engine.foreach_copy(dsts, srcs, non_blocking, stats=mode.stats, op=op,
                        strict=mode.strict, verify=mode.verify)


def _foreach_copy(mode, op, args, kwargs):
    # Functional variant (what functionalization emits): stock's outputs keep each destination's
    # sizes and strides (contiguous where those overlap themselves, as clone does), and every
    # element is overwritten, so an uninitialised allocation suffices.
    dsts, srcs = args[0], args[1]
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    outs = [_like(d) for d in dsts]
    engine.foreach_copy(outs, srcs, non_blocking, stats=mode.stats, op=op,
                        strict=mode.strict, verify=mode.verify, bump=False)
    return outs


def _like(d: torch.Tensor) -> torch.Tensor:
    if d.is_contiguous() or torch._debug_has_internal_overlap(d) != 1:
        return torch.empty_strided(d.shape, d.stride(), dtype=d.dtype, device=d.device)
    return torch.empty(d.shape, dtype=d.dtype, device=d.device)


def _all_gather_copy_in(mode, op, args, kwargs):
    bound = list(args) + [kwargs[k] for k in _FSDP_SCHEMA[len(args):]]
    return engine.all_gather_copy_in(*bound, stats=mode.stats, op=op, strict=mode.strict, verify=mode.verify,
                                   force_views=True)


def _fsdp_op():
    """``fsdp.all_gather_copy_in.default`` if this torch defines it with the schema we support."""
    if not torch.distributed.is_available():
        return None, "torch built without distributed"
    importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_collectives")  # defines fsdp::

    op = torch.ops.fsdp.all_gather_copy_in.default
    names = tuple(a.name for a in op._schema.arguments)
    if names != _FSDP_SCHEMA:
        return op, f"unsupported fsdp::all_gather_copy_in schema {op._schema}"
    return op, None


# Filled on the first NpuFastCopyMode(): finding the FSDP op imports FSDP, which costs ~1 s, and
# `import npu_dispatch` should not pay that.
# id(op) -> (op, handler or None where the op only passes through, "namespace.name"). Keyed by
# id: OpOverload hashes in Python (about 150 ns a lookup here), and every op of a block under the
# mode passes this lookup. The entries hold the ops, so no id is reused while listed.
_TABLE: dict = {}


def _install_handlers() -> None:
    if _TABLE:
        return
    from . import ops  # noqa: F401  registers npu_dispatch::

    handlers = {
        aten._foreach_copy_.default: _foreach_copy_,
        aten._foreach_copy.default: _foreach_copy,
        torch.ops.npu_dispatch.foreach_copy_.default: _foreach_copy_,
        torch.ops.npu_dispatch.all_gather_copy_in.default: _all_gather_copy_in,
    }
    passthrough: dict = {}
    fsdp, why = _fsdp_op()
    if fsdp is not None and why is None:
        handlers[fsdp] = _all_gather_copy_in
    elif fsdp is not None:
        log.warning("npu_dispatch: passing fsdp.all_gather_copy_in through to stock: %s", why)
        passthrough[fsdp] = why
    entries = {op: None for op in passthrough} | handlers
    _TABLE.update({id(op): (op, h, f"{op.namespace}.{op._opname}") for op, h in entries.items()})


def _infra_mode_below(get=torch._C._get_dispatch_mode, proxy=torch._C._TorchDispatchModeKey.PROXY,
                      fake=torch._C._TorchDispatchModeKey.FAKE,
                      functional=torch._C._TorchDispatchModeKey.FUNCTIONAL) -> bool:
    """Whether an infra dispatch mode (proxy, fake, functional: always below the user modes) is
    set on this thread."""
    return get(proxy) is not None or get(fake) is not None or get(functional) is not None


class _Front(TorchFunctionMode):
    """NpuFastCopyMode's front: a Python call of ``torch._foreach_copy_`` (FSDP2 makes them) that
    the fast lane takes is copied here, before the dispatcher boxes every tensor of both lists
    for ``__torch_dispatch__`` (about 0.2 us a tensor, more than the lane's whole copy of a list
    of tiny tensors). Anything else goes on to dispatch unchanged, and to the mode."""

    def __init__(self, owner: "NpuFastCopyMode") -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch._foreach_copy_ and self.owner._lane_copy(args, kwargs):
            return args[0]  # as the binding returns its ``self`` list
        return func(*args, **kwargs)


class NpuFastCopyMode(TorchDispatchMode):
    """Routes ``aten._foreach_copy_``, ``aten._foreach_copy`` and ``fsdp.all_gather_copy_in`` (and the
    ``npu_dispatch::`` ops, as compiled code calls them) through the copy planner.

    Results, errors and version-counter bumps are those of the stock ops without a mode.

    Args:
        strict: raise :class:`npu_dispatch.FastCopyFallbackError`, naming the reason, whenever a
            call would leave the fast path (raised before anything is written).
        verify: also run the stock op on clones of the destinations and raise
            :class:`npu_dispatch.FastCopyMismatchError` on any bitwise difference (slow: a
            debugging aid).
        front: also catch Python calls of ``torch._foreach_copy_`` (FSDP2's own, lists or tuples)
            before the dispatcher, with a ``TorchFunctionMode`` pushed with this mode: a list the
            fast lane takes (plain contiguous CPU pairs, no grad, no overlap) is copied there
            without the argument parsing of the stock binding that even the mode's native dispatch
            route pays (about 0.1 us a tensor on the CI machine: 512 tiny tensors, stock 320 to
            480 us, the route's floor 55 to 105 us). Anything else goes on to
            dispatch unchanged, and so does every call while another torch function mode entered
            before this one (``torch.set_default_device`` pushes one) or another dispatch mode is
            active, or a compiler, tracer, profiler or forward AD is at work. Costs:
            ``torch.compile`` guards on the torch-function mode stack, so a compiled function
            called both inside and outside such a mode is compiled once for each; and every
            other torch call in the block passes the front too (about 0.9 us each on this CPU).
            Exit modes in the reverse order of entry (RuntimeError otherwise).

    With the native library (and without ``verify``), a call of ``aten._foreach_copy_`` while this
    mode is the only dispatch mode active is first offered to its dispatch route
    (csrc/mode_route.h), a C++ kernel at the PythonTLSSnapshot key: where the fast lane takes the
    lists whole (plain contiguous CPU pairs, no overlap, no tensor that requires grad while grad
    mode is on) and nothing else would act on the call (no forward-AD level, JIT tracer, Python
    dispatcher or functorch layer around it; no ``torch._C._DisableTorchDispatch``), it copies
    them there, before the dispatcher boxes every tensor for ``__torch_dispatch__`` (about 0.2 us
    a tensor), with stock's version bumps (none below ADInplaceOrView, as stock's); anything else
    reaches the handler below unchanged. A mode entered with ``verify`` set gets no route (its comparison with stock
    runs in the handler).

    ``stats`` (:class:`npu_dispatch.CopyStats`) counts calls, tensors, bytes and device launches
    per path and fallbacks by reason, the route's calls included; ``stats.report()`` renders them.
    Tensor subclasses (DTensor ...) are handed back to their own ``__torch_dispatch__``; the
    plain-tensor copies they issue come back to the mode. While an infra dispatch mode is set
    below it (make_fx's proxy mode under ``tracing_mode="real"``, a ``FakeTensorMode``,
    functionalization), every intercepted op goes on to stock unchanged (fallback reason
    ``infra_mode``; ``strict`` does not raise for it, nor for the other hand-backs before planning,
    ``subclass`` and ``schema``), so the trace records it; user modes entered before this one do
    not see the ops it copies. ``ignore_compile_internals()`` is True, so ``torch.compile`` still
    compiles while the mode is active (Dynamo skips frames under any other user mode).
    """

    def __init__(self, strict: bool = False, verify: bool = False, front: bool = False) -> None:
        super().__init__()
        _install_handlers()
        self.strict = strict
        self.verify = verify
        self.front = front
        self.stats = CopyStats()
        self._fronts: list[_Front | None] = []
        self._routes: list = []  # per entry: the native module whose route serves it, or None
        self._route_source = None

    def __enter__(self):
        out = super().__enter__()
        front = _Front(self) if self.front else None
        if front is not None:
            front.__enter__()
        self._fronts.append(front)
        try:
            self._routes.append(self._enter_route())
        except BaseException:
            # Leave nothing pushed: a with-statement whose __enter__ raises never calls __exit__.
            self._routes.append(None)
            self.__exit__(None, None, None)
            raise
        return out

    def _enter_route(self):
        """Let the native dispatch route (csrc/mode_route.h) copy this mode's plain calls
        before the dispatcher boxes them for ``__torch_dispatch__``. Not with ``verify``: its
        comparison with stock runs in the handler."""
        # planned_op() is None wherever the engine plans in Python (no compiler, or a test
        # standing in for one): the route is part of the native library.
        if self.verify or _native.planned_op() is None:
            return None
        module = _native.module()
        if self._route_source is None:
            ref = weakref.ref(self)

            def drain(stats, ref=ref):
                mode = ref()
                if mode is not None:
                    _native.fold_counters(stats, module.mode_route_drain(mode))

            self._route_source = drain
            self.stats.add_source(drain)
        module.mode_route_enter(self)
        return module

    def __exit__(self, exc_type, exc_value, traceback):
        front = self._fronts[-1]
        if front is not None:
            depth = torch._C._len_torch_function_stack()
            if depth == 0 or torch._C._get_function_stack_at(depth - 1) is not front:
                # Popping now would pop the other mode and leave this front behind; nothing is
                # changed, so exiting the other mode first and then this one still works.
                raise RuntimeError("NpuFastCopyMode(front=True) exited while a torch function mode entered "
                                   "after it is still active: exit modes in the reverse order of entry")
            front.__exit__(exc_type, exc_value, traceback)
        self._fronts.pop()
        route = self._routes.pop()
        try:
            return super().__exit__(exc_type, exc_value, traceback)
        finally:
            if route is not None:
                _native.fold_counters(self.stats, route.mode_route_exit(self))

    def _lane_copy(self, args, kwargs) -> bool:
        """The front's check: this mode is the only mode (dispatch or torch function) that would
        see the call, nothing records or differentiates it, and the fast lane (C++, its own checks:
        plain contiguous CPU pairs, no grad, no overlap...) takes it whole. True when copied."""
        if (self.verify or len(args) < 2 or type(args[0]) not in (list, tuple) or type(args[1]) not in (list, tuple)
                or torch._C._autograd._profiler_enabled()  # the profiler records the op itself
                or torch._C._len_torch_function_stack() != 0
                or torch._C._len_torch_dispatch_stack() != 1 or _get_current_dispatch_mode() is not self
                or engine.recorded() or engine.busy()):
            return False
        direct = _native.direct_op()
        if direct is None:
            return False
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        start = time.perf_counter()
        v = direct(args[0], args[1], bool(non_blocking), True)
        if v is False:
            return False
        _, counts, reasons = decode_counts(v)
        self.stats.record_counts("aten._foreach_copy_", counts, reasons, time.perf_counter() - start)
        return True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        entry = _TABLE.get(id(func))
        if entry is None:
            return func(*args, **(kwargs or {}))
        _, handler, name = entry
        if handler is None:
            self.stats.record_passthrough(name, "schema")
            return func(*args, **(kwargs or {}))
        if engine.busy():
            # A stock call issued by the engine of a mode nested inside this one.
            return func(*args, **(kwargs or {}))
        if torch._C._len_torch_dispatch_stack() and _infra_mode_below():
            # make_fx's proxy mode (tracing_mode="real"), FakeTensorMode or functionalization
            # sits below every user mode and must see the op itself: a native copy here would
            # leave it out of a traced graph.
            self.stats.record_passthrough(name, "infra_mode")
            return func(*args, **(kwargs or {}))
        if types and any(t is not torch.Tensor for t in types):
            if all(t is torch.Tensor or is_traceable_wrapper_subclass_type(t) for t in types):
                # A wrapper subclass (DTensor, TwoTensor...) unwraps itself; the plain-tensor
                # copies it issues come back to this mode.
                self.stats.record_passthrough(name, "subclass")
                return NotImplemented
            # FakeTensor and other non-wrapper subclasses: their own semantics, untouched.
            self.stats.record_passthrough(name, "subclass")
            return func(*args, **(kwargs or {}))
        return handler(self, name, args, kwargs or {})
