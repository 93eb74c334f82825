"""The ``native`` strategy: one extern kernel call to ``npu_dispatch::foreach_copy_`` per node.

The generated code calls ``torch.ops.npu_dispatch.foreach_copy_.default(dsts, srcs, non_blocking)``
once per graph node; the planner (``npu_dispatch.plan``) decides at run time how many device
launches that takes (a coalesced flat copy for adjacent runs, the device's batched foreach kernel,
stock for the rest), so compile time does not grow with the list and backends without foreach
kernels (npu) still get batched copies. The op's schema (``Tensor(a!)[] self``) tells Inductor
which buffers the call writes, so reads after it are ordered after it. Under
``NpuFastCopyMode`` each call is counted like an eager one.

- ``fsdp.all_gather_copy_in``: the call writes the all-gather inputs into IR views of
  ``all_gather_output`` (``lowerings/views.py``); returns those views.
- ``aten._foreach_copy`` (functional): fresh output buffers with the strides the FX graph
  recorded, then the call.
- ``aten._foreach_copy_``: the call on the destinations.
"""
from __future__ import annotations

import torch
from torch._inductor import ir
from torch._inductor import lowering as L
from torch._inductor.utils import convert_shape_to_inductor
from torch._inductor.virtualized import V

from . import views

__all__ = ["all_gather_copy_in", "foreach_copy", "foreach_copy_"]


def _call(dsts, srcs, non_blocking=False) -> None:
    ir.FallbackKernel.create(torch.ops.npu_dispatch.foreach_copy_.default, list(dsts), list(srcs), non_blocking)


def all_gather_copy_in(all_gather_inputs, all_gather_output, inp_split_sizes, all_gather_input_numel, rank):
    """Lowering of ``all_gather_copy_in``: one ``npu_dispatch::foreach_copy_`` into output views."""
    agi, dsts = views.copy_in_views(all_gather_output, inp_split_sizes, all_gather_input_numel, rank)
    _call(dsts, all_gather_inputs)
    return agi, all_gather_output


def foreach_copy(self, src, non_blocking=False):
    """Lowering of functional ``_foreach_copy``: allocate outputs like ``self``, then one call."""
    vals = V.graph.current_node.meta["val"]
    empty = L.lowerings[torch.ops.aten.empty_strided.default]
    outs = [
        empty(list(d.get_size()), convert_shape_to_inductor(v.stride()), dtype=d.get_dtype(), device=d.get_device())
        for d, v in zip(self, vals)
    ]
    _call(outs, src, non_blocking)
    return outs


def foreach_copy_(self, src, non_blocking=False):
    """Lowering of in-place ``_foreach_copy_``: one call on the destinations."""
    _call(self, src, non_blocking)
    return self
