"""Inductor IR views: consecutive 1-D slices of one realized 1-D buffer.

A bucket copy-in writes every all-gather input into its slice of the bucket, in input order, as
eager does (``torch/_inductor/fx_passes/bucketing.py``: ``new_ag_out.narrow(0, numel * rank,
numel)`` then ``torch.split`` by the inputs' sizes). Writes go through these views, so the value
the graph goes on with is the bucket itself, never a copy.
"""
from __future__ import annotations

import sympy
from torch._inductor import ir

__all__ = ["slices"]


def _view(storage, layout, start, length) -> ir.TensorBox:
    stride = layout.stride[0]
    fixed = ir.FixedLayout(
        layout.device, layout.dtype, [length], [stride], sympy.expand(layout.offset + start * stride)
    )
    return ir.TensorBox(ir.ReinterpretView(data=storage, layout=fixed))


def slices(buf: ir.TensorBox, start, sizes) -> list[ir.TensorBox]:
    """One 1-D view of ``buf`` per entry of ``sizes``, the first at element ``start``.

    Args:
        buf: a 1-D TensorBox; realized here (a fresh buffer's layout is frozen).
        start: element offset of the first view (int or sympy expression).
        sizes: element count of each view (ints or sympy expressions).
    """
    buf.realize()
    storage, layout = ir.as_storage_and_layout(buf, freeze=True)
    out = []
    for size in sizes:
        out.append(_view(storage, layout, start, size))
        start = start + size
    return out
