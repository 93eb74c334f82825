"""Inductor lowerings for the copies of compile-first FSDP (imported as ``npu_dispatch.lowerings``).

Compile-first FSDP (DTensor parameters, the whole model under ``torch.compile``, Inductor's
collective bucketing: SimpleFSDP, torchtitan) copies through what the bucketing passes emit; these
lowerings take those copies::

    import npu_dispatch.lowerings as ndl
    ndl.register()                                   # then any torch.compile(..., backend="inductor")
    torch.compile(fn, backend="npu_dispatch")        # Inductor with the lowerings, only for this fn

- the bucketed all-gather copy-in (``bucket_copy_in.py``): ``cat`` + ``copy_`` (bucket mode
  ``"default"``) and ``bucketing::_pre_bucket_all_gather`` (``"custom_ops"``), written straight
  from the fp32 shards into the bf16 bucket, the cast fused;
- the reduce-scatter copy-in of mode ``"custom_ops"`` (``reduce_scatter_copy_in.py``):
  ``bucketing::_pre_bucket_reduce_scatter`` as Inductor's ``cat(dim=1)``, the cast fused.

``fused`` writes with Inductor, ``native`` makes one extern ``npu_dispatch::foreach_copy_`` call;
``auto`` picks per device type and list length (``strategy.py``). ``fully_shard`` (FSDP2) needs
none of this: its copies run eagerly around compiled code, and ``NpuFastCopyMode`` serves them.
"""
from .register import active, current_strategy, is_registered, register, unregister
from .strategy import MAX_FUSED_TENSORS, STRATEGIES

__all__ = ["register", "unregister", "is_registered", "current_strategy", "active", "STRATEGIES", "MAX_FUSED_TENSORS"]
