"""Install and remove the lowerings; ``unregister()`` restores exactly what was there before.

What ``register()`` changes, all undone by ``unregister()``:

- ``torch._inductor.lowering.lowerings`` entries of ``fsdp.all_gather_copy_in.default``,
  ``aten._foreach_copy.default`` and ``aten._foreach_copy_.default`` (an entry that was absent,
  e.g. the copy-in before its first implicit fallback, is absent again);
- for those ops, membership in ``lowering.fallbacks`` and ``lowering.needs_realized_inputs`` and
  any ``_maybe_layout_constraints`` entry: an implicit fallback leaves these behind, and they
  would realize (materialise) the copy-in's inputs before our lowering could fuse them;
- ``torch._inductor.config.post_grad_custom_post_pass``: :class:`~.graph_pass.CopyInPass` is
  appended (its ``uuid()`` keeps FX-graph / AOTAutograd cache entries apart);
- a ``torch_dispatch`` rule for ``aten._foreach_copy_`` under ``FunctionalTensorMode``
  (``functionalize.py``).

Lowerings are read when Inductor lowers a graph, so call ``register()`` before compiling; code
already compiled (Dynamo's cache on the function) keeps the lowering it was compiled with.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import threading

import torch

from . import fused, native, strategy as _strategy
from .functionalize import install as _install_rule
from .graph_pass import CopyInPass

__all__ = ["register", "unregister", "is_registered", "current_strategy", "active"]

log = logging.getLogger("npu_dispatch.lowerings")
aten = torch.ops.aten
_lock = threading.RLock()


@dataclasses.dataclass
class _Saved:
    lowerings: dict
    fallbacks: set
    needs_realized: set
    constraints: dict
    post_pass: object
    rule_lib: torch.library.Library


_state: dict = {"saved": None, "strategy": None}


def _copy_in_op():
    importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_collectives")  # defines fsdp::
    return torch.ops.fsdp.all_gather_copy_in.default


def _ops():
    import npu_dispatch.ops  # noqa: F401  defines npu_dispatch::, which native calls

    return [_copy_in_op(), aten._foreach_copy.default, aten._foreach_copy_.default]


_MISSING = object()


def _rounds_away(x, out) -> bool:
    return x.get_dtype() in (torch.bfloat16, torch.float16) and x.get_dtype() != out.get_dtype()


def _dispatchers(prev: dict) -> dict:
    """Our lowering per op: pick a strategy per node, keep ``prev`` for what we decline."""
    from . import views

    copy_in, fc, fc_ = _ops()

    def prev_or_fallback(op):
        fn = prev.get(op, _MISSING)
        if fn is _MISSING:
            from torch._inductor.lowering import fallback_handler

            return fallback_handler(op, add_to_fallback_set=False)
        return fn

    def lower_copy_in(inputs, out, split_sizes, numel, rank):
        why = views.supports(inputs, out)
        if why is not None:
            log.info("npu_dispatch.lowerings: all_gather_copy_in kept stock: %s", why)
            return prev_or_fallback(copy_in)(inputs, out, split_sizes, numel, rank)
        s = _strategy.choose(_state["strategy"], out.get_device(), len(inputs), "all_gather_copy_in")
        if s == "fused" and any(_rounds_away(x, out) for x in inputs):
            # Inductor computes bf16/fp16 values in fp32 inside a kernel: fused into a write of
            # another dtype, the rounding eager does when it stores the input would be lost.
            log.info("npu_dispatch.lowerings: all_gather_copy_in -> native: a bf16/fp16 input "
                     "written into a %s output", out.get_dtype())
            s = "native"
        impl = fused.all_gather_copy_in if s == "fused" else native.all_gather_copy_in
        return impl(inputs, out, split_sizes, numel, rank)

    def lower_foreach_copy(self, src, non_blocking=False):
        s = _strategy.choose(_state["strategy"], self[0].get_device(), len(self), "_foreach_copy")
        if s == "fused":
            return fused.foreach_copy(prev_or_fallback(fc), self, src, non_blocking)
        return native.foreach_copy(self, src, non_blocking)

    def lower_foreach_copy_(self, src, non_blocking=False):
        s = _strategy.choose(_state["strategy"], self[0].get_device(), len(self), "_foreach_copy_")
        impl = fused.foreach_copy_ if s == "fused" else native.foreach_copy_
        return impl(self, src, non_blocking)

    return {copy_in: lower_copy_in, fc: lower_foreach_copy, fc_: lower_foreach_copy_}


def register(strategy: str = "auto") -> None:
    """Install the copy lowerings in Inductor (idempotent; a new ``strategy`` replaces the old).

    Args:
        strategy: ``"auto"`` (per device type and list length, see ``strategy.py``), ``"fused"``
            or ``"native"``.

    Raises:
        ValueError: an unknown strategy.
    """
    from torch._inductor import config
    from torch._inductor import lowering as L

    _strategy.check(strategy)
    with _lock:
        if _state["saved"] is not None:
            _state["strategy"] = strategy
            _replace_pass(config, strategy)
            return
        ops = _ops()
        saved = _Saved(
            lowerings={op: L.lowerings[op] for op in ops if op in L.lowerings},
            fallbacks={op for op in ops if op in L.fallbacks},
            needs_realized={op for op in ops if op in L.needs_realized_inputs},
            constraints={op: L._maybe_layout_constraints[op] for op in ops if op in L._maybe_layout_constraints},
            post_pass=config.post_grad_custom_post_pass,
            rule_lib=_install_rule(),
        )
        for op, fn in _dispatchers(saved.lowerings).items():
            L.lowerings[op] = fn
            L.fallbacks.discard(op)
            L.needs_realized_inputs.discard(op)
            L._maybe_layout_constraints.pop(op, None)
        _state["saved"], _state["strategy"] = saved, strategy
        _replace_pass(config, strategy)
        log.info("npu_dispatch.lowerings: registered (strategy=%s)", strategy)


def _replace_pass(config, strategy: str) -> None:
    saved = _state["saved"].post_pass
    kept = [] if saved is None else list(saved) if isinstance(saved, (list, tuple)) else [saved]
    config.post_grad_custom_post_pass = [*kept, CopyInPass(strategy)] if kept else CopyInPass(strategy)


def unregister() -> None:
    """Remove the lowerings and restore every saved entry (a no-op when not registered)."""
    from torch._inductor import config
    from torch._inductor import lowering as L

    with _lock:
        saved = _state["saved"]
        if saved is None:
            return
        for op in _ops():
            if op in saved.lowerings:
                L.lowerings[op] = saved.lowerings[op]
            else:
                L.lowerings.pop(op, None)
            if op in saved.fallbacks:
                L.fallbacks.add(op)
            if op in saved.needs_realized:
                L.needs_realized_inputs.add(op)
            if op in saved.constraints:
                L._maybe_layout_constraints[op] = saved.constraints[op]
        config.post_grad_custom_post_pass = saved.post_pass
        saved.rule_lib._destroy()
        _state["saved"], _state["strategy"] = None, None
        log.info("npu_dispatch.lowerings: unregistered")


def is_registered() -> bool:
    """Whether the lowerings are installed."""
    return _state["saved"] is not None


def current_strategy() -> str | None:
    """The strategy in force, or None when not registered."""
    return _state["strategy"]


@contextlib.contextmanager
def active(strategy: str = "auto"):
    """The lowerings with ``strategy`` for the ``with`` body, then the previous state again."""
    with _lock:
        was = _state["strategy"]
        register(strategy)
        try:
            yield
        finally:
            if was is None:
                unregister()
            else:
                register(was)
