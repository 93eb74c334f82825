"""The bucketed reduce-scatter copy-in of bucket mode ``custom_ops``, lowered to Inductor's ``cat``.

``bucketing::_pre_bucket_reduce_scatter(grads, world)`` (``torch/_inductor/fx_passes/bucketing.py``)
is ``torch.cat([g.reshape(world, -1) for g in grads], dim=1).flatten()``: FSDP's chunk_cat with
world chunks along dim 0. As a custom op it is an opaque Python fallback, and the gradients' casts
to the reduce dtype (bf16 -> fp32) are materialised before it, each its own buffer. Lowered to the
``cat`` it is, each gradient is written into its columns of the bucket with its cast fused: the
same kernel stock Inductor emits for bucket mode ``"default"``, whose ``cat(dim=1)`` it already
lowers that way (``ConcatKernel``; nothing of ours is needed there).
"""
from __future__ import annotations

import logging

from torch._inductor import lowering as L

__all__ = ["lower_pre_bucket_reduce_scatter"]

log = logging.getLogger("npu_dispatch.lowerings")


def lower_pre_bucket_reduce_scatter(prev, stock_cat):
    """Our lowering of ``_pre_bucket_reduce_scatter(rs_ins, group_size) -> Tensor``.

    Args:
        prev: the lowering it replaces (the fallback), for inputs of mixed dtypes or devices (the
            op's ``torch.cat`` promotes, its fake kernel does not; stock keeps that as is).
        stock_cat: upstream's ``aten.cat`` lowering.

    Returns a 1-D buffer of ``sum(numel)`` elements of the inputs' dtype.
    """

    def pre_bucket_reduce_scatter(rs_ins, group_size):
        dtype, device = rs_ins[0].get_dtype(), rs_ins[0].get_device()
        if any(x.get_dtype() != dtype or x.get_device() != device for x in rs_ins):
            log.info("npu_dispatch.lowerings: _pre_bucket_reduce_scatter kept stock: mixed dtypes or devices")
            return prev(rs_ins, group_size)
        rows = [L.view(x, [group_size, -1]) for x in rs_ins]
        return L.view(stock_cat(rows, 1), [-1])

    return pre_bucket_reduce_scatter
