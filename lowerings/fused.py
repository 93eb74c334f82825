"""The ``fused`` strategy: copies become Inductor writes, so producers fuse into them.

- ``fsdp.all_gather_copy_in``: each all-gather input is written straight into its slice of
  ``all_gather_output`` (a ``MutationLayoutSHOULDREMOVE`` write through a ``ReinterpretView``,
  as upstream's ``copy_`` lowering writes into a view). The dtype cast that produced the input
  (FSDP's mixed-precision ``_foreach_copy_``) is inlined into that write: no intermediate buffer,
  no Python fallback. Returns views of ``all_gather_output``, as eager does.
- ``aten._foreach_copy`` (functional, what functionalization emits): the per-pair values stay
  lazy when every consumer is a copy-in, so they fuse into the copy-in writes; otherwise the
  previous (stock) lowering runs unchanged.
- ``aten._foreach_copy_``: pair by pair, in list order, each source read after the writes before
  it (stock's sequential ``copy_`` loop, ``aten/src/ATen/native/ForeachOpsKernels.cpp``), also
  on foreach (Triton) backends, where upstream reads every source first.

Bits: Inductor's casts round like ATen's (round to nearest even), so every non-NaN value, infinity,
signed zero and subnormal is bitwise equal to eager stock. A NaN stays a NaN but its payload can
differ from eager's on a narrowing float cast (fp32 -> bf16 on x86: ATen's vectorized conversion
writes 0xFFFF everywhere; Inductor's C++ backend emits scalar loops for tiny tensors, which write
0x7FC0). Stock Inductor has the same property. ``native`` runs ATen's kernels and matches every bit.

On backends with foreach kernels, the writes of one node are registered as operation lists
(``CHUNK`` at a time) so the scheduler emits horizontal kernels; never when a write reads what an
earlier write of the same node wrote (one kernel would race).
"""
from __future__ import annotations

import torch
from torch._inductor import ir
from torch._inductor import lowering as L
from torch._inductor.codegen.common import BackendFeature
from torch._inductor.virtualized import V

from . import views

__all__ = ["all_gather_copy_in", "foreach_copy", "foreach_copy_", "CHUNK"]

# Writes per operation list (one horizontal kernel); keeps kernels under argument limits.
CHUNK = 128


def _is_copy_in(node) -> bool:
    target = getattr(node.target, "_schema", None)
    return node.op == "call_function" and target is not None and target.name in (
        "fsdp::all_gather_copy_in", "npu_dispatch::all_gather_copy_in"
    )


def _write(dst: ir.TensorBox, value) -> ir.Buffer:
    """``dst.copy_(value)`` as one Inductor write; returns the write's buffer."""
    value = L.to_device(value, dst.get_device())
    value = L.to_dtype(value, dst.get_dtype())
    value = L.expand(value, dst.get_size())
    return ir.MutationLayoutSHOULDREMOVE.realize_into(value, dst.data)


def _register_lists(writes: list[ir.Buffer], device) -> None:
    """Group writes into horizontal kernels where the backend has them and it is safe."""
    if len(writes) < 2 or not V.graph.has_feature(device, BackendFeature.FOREACH):
        return
    written: set[str] = set()
    for w in writes:
        if w.get_read_names() & written:
            return  # a later write reads an earlier one: keep them ordered kernels
        written.add(w.get_layout().get_buffer().get_name())
    names = [w.get_operation_name() for w in writes]
    for k in range(0, len(names), CHUNK):
        if len(names[k:k + CHUNK]) > 1:
            V.graph.register_operation_list(names[k:k + CHUNK])


def all_gather_copy_in(all_gather_inputs, all_gather_output, inp_split_sizes, all_gather_input_numel, rank):
    """Lowering of ``all_gather_copy_in`` (schema of ``fsdp::all_gather_copy_in``).

    Args (Inductor IR): 1-D inputs, a 1-D output of ``world_size * all_gather_input_numel``
    elements, split sizes, numel and rank as ints or sympy expressions.

    Returns:
        ``(all_gather_input, all_gather_output)`` as IR views of ``all_gather_output``.
    """
    agi, dsts = views.copy_in_views(all_gather_output, inp_split_sizes, all_gather_input_numel, rank)
    writes = [_write(d, x) for d, x in zip(dsts, all_gather_inputs)]
    _register_lists(writes, all_gather_output.get_device())
    return agi, all_gather_output


def _only_copy_in_consumers() -> bool:
    users = [u for g in V.graph.current_node.users for u in g.users]
    return bool(users) and all(_is_copy_in(u) for u in users)


def foreach_copy(prev, self, src, non_blocking=False):
    """Lowering of functional ``_foreach_copy``; ``prev`` is the lowering it replaces."""
    if not _only_copy_in_consumers():
        return prev(self, src, non_blocking)
    copy = L.lowerings[torch.ops.aten.copy.default]
    return [copy(d, s) for d, s in zip(self, src)]


def foreach_copy_(self, src, non_blocking=False):
    """Lowering of in-place ``_foreach_copy_``: one write per pair, in list order."""
    writes = [_write(d, s) for d, s in zip(self, src)]
    _register_lists(writes, self[0].get_device())
    return self
