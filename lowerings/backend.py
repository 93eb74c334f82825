"""The ``"npu_dispatch"`` ``torch.compile`` backend: Inductor with the copy lowerings active.

Registered through the ``torch_dynamo_backends`` entry point (``pyproject.toml``), so
``torch.compile(fn, backend="npu_dispatch")`` works without importing this package first. The
lowerings are active only while this backend compiles (the forward graph, and the backward graph
that AOTAutograd compiles lazily at the first backward), so ``backend="inductor"`` in the same
process keeps stock lowerings unless ``npu_dispatch.lowerings.register()`` was called.
"""
from __future__ import annotations

import functools

from .register import active
from .strategy import check

__all__ = ["npu_dispatch_backend", "make_backend"]


def make_backend(strategy: str = "auto"):
    """A ``torch.compile`` backend (a callable) that is Inductor with ``strategy``'s lowerings.

    Raises:
        ValueError: an unknown strategy.
    """
    check(strategy)

    def backend(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        @functools.wraps(compile_fx_inner)
        def inner(*args, **kwargs):
            with active(strategy):
                return compile_fx_inner(*args, **kwargs)

        with active(strategy):
            return compile_fx(gm, example_inputs, inner_compile=inner)

    backend.__name__ = f"npu_dispatch_{strategy}"
    return backend


npu_dispatch_backend = make_backend("auto")
npu_dispatch_backend.__doc__ = "Inductor with the copy lowerings (strategy ``auto``); see the module docstring."
