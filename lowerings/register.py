"""Install and remove the lowerings; ``unregister()`` restores exactly what was there before.

What ``register()`` changes, all undone by ``unregister()``:

- ``torch._inductor.lowering.lowerings`` entries of ``aten.cat.default`` (the default-mode bucket
  copy-in, ``bucket_copy_in.py``; every other ``cat`` is passed to the lowering it wraps),
  ``bucketing._pre_bucket_all_gather.default`` and ``bucketing._pre_bucket_reduce_scatter.default``
  (an entry that was absent, as a custom op's is before its first implicit fallback, is absent
  again);
- for those ops, membership in ``lowering.fallbacks`` and ``lowering.needs_realized_inputs`` and
  any ``_maybe_layout_constraints`` entry: an implicit fallback leaves these behind, and they
  would realize the inputs (the casts) before our lowering could fuse them;
- ``torch._inductor.config.post_grad_custom_pre_pass``: a :class:`CacheKey` pass (it changes no
  graph) is appended to whatever is there at the time (``unregister()`` removes only it), so its ``uuid()`` (the hash of this package's source and the strategy)
  keeps FX-graph and AOTAutograd cache entries made with and without the lowerings apart.

The lowerings act at lowering time, after every FX pass, so they see what the bucketing passes
emit and need no pass of their own: a backend that assigns ``post_grad_custom_post_pass``
outright (torchtitan's does) changes nothing here. Call ``register()`` before compiling: code
already compiled (Dynamo's cache on the function) keeps the lowerings it was compiled with.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import threading

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from . import strategy as _strategy
from .bucket_copy_in import lower_cat, lower_pre_bucket_all_gather
from .reduce_scatter_copy_in import lower_pre_bucket_reduce_scatter

__all__ = ["register", "unregister", "is_registered", "current_strategy", "active", "CacheKey"]

log = logging.getLogger("npu_dispatch.lowerings")
aten = torch.ops.aten
_lock = threading.RLock()
_SOURCES = tuple(
    sorted(os.path.join(os.path.dirname(__file__), f) for f in os.listdir(os.path.dirname(__file__)) if f.endswith(".py"))
)


class CacheKey(CustomGraphPass):
    """A post-grad pass that changes nothing: its ``uuid()`` enters Inductor's and AOTAutograd's
    cache keys, so a graph compiled without the lowerings is never served with them, nor the
    other way round."""

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy

    def __call__(self, graph: torch.fx.Graph) -> None:
        return None

    def uuid(self):
        return ("npu_dispatch.lowerings", self.strategy, get_hash_for_files(_SOURCES))


@dataclasses.dataclass
class _Saved:
    lowerings: dict
    fallbacks: set
    needs_realized: set
    constraints: dict
    pre_pass: object


_state: dict = {"saved": None, "strategy": None}


def _ops():
    """The ops we lower: ``aten.cat`` and the two bucketing custom ops (defined on import)."""
    importlib.import_module("torch._inductor.fx_passes.bucketing")  # defines bucketing::
    b = torch.ops.bucketing
    return [aten.cat.default, b._pre_bucket_all_gather.default, b._pre_bucket_reduce_scatter.default]


_MISSING = object()


def _dispatchers(prev: dict) -> dict:
    """Our lowering per op, each keeping ``prev``'s (or the implicit fallback) for what it declines."""
    cat, ag, rs = _ops()

    def prev_or_fallback(op):
        fn = prev.get(op, _MISSING)
        if fn is _MISSING:
            from torch._inductor.lowering import fallback_handler

            return fallback_handler(op, add_to_fallback_set=False)
        return fn

    def requested():
        return _state["strategy"] or "auto"

    return {
        cat: lower_cat(prev_or_fallback(cat), requested),
        ag: lower_pre_bucket_all_gather(prev_or_fallback(ag), requested),
        rs: lower_pre_bucket_reduce_scatter(prev_or_fallback(rs), prev_or_fallback(cat)),
    }


def register(strategy: str = "auto") -> None:
    """Install the lowerings in Inductor (idempotent; a new ``strategy`` replaces the old).

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
            pre_pass=config.post_grad_custom_pre_pass,
        )
        for op, fn in _dispatchers(saved.lowerings).items():
            L.lowerings[op] = fn
            L.fallbacks.discard(op)
            L.needs_realized_inputs.discard(op)
            L._maybe_layout_constraints.pop(op, None)
        _state["saved"], _state["strategy"] = saved, strategy
        _replace_pass(config, strategy)
        log.info("npu_dispatch.lowerings: registered (strategy=%s)", strategy)


def _without_key(passes) -> list:
    """The current pre-pass config as a list, without our :class:`CacheKey` entries."""
    kept = [] if passes is None else list(passes) if isinstance(passes, (list, tuple)) else [passes]
    return [p for p in kept if not isinstance(p, CacheKey)]


def _replace_pass(config, strategy: str) -> None:
    """Append a fresh :class:`CacheKey` to whatever the pre pass is now (a pass the user set
    after ``register()`` is kept)."""
    kept = _without_key(config.post_grad_custom_pre_pass)
    config.post_grad_custom_pre_pass = [*kept, CacheKey(strategy)] if kept else CacheKey(strategy)


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
        kept = _without_key(config.post_grad_custom_pre_pass)
        config.post_grad_custom_pre_pass = kept[0] if len(kept) == 1 else (kept or None)
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
