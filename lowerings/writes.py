"""Copies as Inductor writes or as one extern call: the two ways a lowering here copies.

- :func:`write` (strategy ``fused``): ``dst.copy_(value)`` as one Inductor write through a view,
  as upstream's ``copy_`` lowering writes into a view (``torch/_inductor/lowering.py``
  ``mutate_to``). The producer of ``value`` (a dtype cast, a reshape) is inlined into the write:
  no temporary buffer. Inductor's casts round to nearest even like ATen's, so every non-NaN value,
  infinity, signed zero and subnormal matches eager; a NaN stays a NaN (its payload may differ on
  a narrowing cast, as it may under stock Inductor).
- :func:`extern_foreach_copy` (strategy ``native``): one ``npu_dispatch::foreach_copy_`` extern
  kernel call; the run-time planner coalesces, groups by dtype pair and sends groups to the
  device's batched kernel (op-plugin's ``aclnnForeachCopy`` on Ascend), so a backend without
  foreach kernels still gets few launches.
"""
from __future__ import annotations

import torch
from torch._inductor import ir
from torch._inductor import lowering as L
from torch._inductor.codegen.common import BackendFeature
from torch._inductor.virtualized import V

__all__ = ["write", "write_all", "extern_foreach_copy", "CHUNK"]

# Writes per operation list (one horizontal kernel on foreach backends); under argument limits.
CHUNK = 128


def write(dst: ir.TensorBox, value) -> ir.Buffer:
    """``dst.copy_(value)`` as one Inductor write; returns the write's buffer."""
    value = L.to_device(value, dst.get_device())
    value = L.to_dtype(value, dst.get_dtype())
    value = L.expand(value, dst.get_size())
    return ir.MutationLayoutSHOULDREMOVE.realize_into(value, dst.data)


def write_all(dsts, values) -> None:
    """:func:`write` pair by pair, grouped into horizontal kernels where the backend has them."""
    writes = [write(d, v) for d, v in zip(dsts, values)]
    if len(writes) < 2 or not V.graph.has_feature(dsts[0].get_device(), BackendFeature.FOREACH):
        return
    names = [w.get_operation_name() for w in writes]
    for k in range(0, len(names), CHUNK):
        if len(names[k:k + CHUNK]) > 1:
            V.graph.register_operation_list(names[k:k + CHUNK])


def extern_foreach_copy(dsts, srcs) -> None:
    """One extern call ``npu_dispatch::foreach_copy_(dsts, srcs)``; its schema (``Tensor(a!)[]
    self``) tells Inductor which buffers it writes, so later reads are ordered after it."""
    import npu_dispatch.ops  # noqa: F401  defines npu_dispatch::foreach_copy_

    ir.FallbackKernel.create(torch.ops.npu_dispatch.foreach_copy_.default, list(dsts), list(srcs), False)
