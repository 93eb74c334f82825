"""Inductor lowerings for the copy fast path (imported as ``npu_dispatch.lowerings``).

Two ways to use them::

    import npu_dispatch.lowerings as ndl
    ndl.register()                                   # then any torch.compile(..., backend="inductor")
    torch.compile(fn, backend="npu_dispatch")        # Inductor with the lowerings, only for this fn

They lower ``fsdp.all_gather_copy_in``, ``aten._foreach_copy`` and ``aten._foreach_copy_`` with the
``fused`` strategy (Inductor writes into slices of the all-gather output, producers fused in) or
the ``native`` one (one extern call to ``npu_dispatch::foreach_copy_`` per node); ``auto`` picks per
device type and list length (``strategy.py``). See ``register.py`` for what registration changes.
"""
from .register import active, current_strategy, is_registered, register, unregister
from .strategy import MAX_FUSED_TENSORS, STRATEGIES

__all__ = ["register", "unregister", "is_registered", "current_strategy", "active", "STRATEGIES", "MAX_FUSED_TENSORS"]
