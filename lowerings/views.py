"""Inductor IR views of the all-gather output: this rank's slice and its per-input splits.

Mirrors the eager copy-in (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``
``all_gather_copy_in``): ``out.narrow(0, numel * rank, numel)`` then ``torch.split`` by
``inp_split_sizes``. Both strategies write through these views, so the values the graph returns
are views of ``all_gather_output`` (aliasing as eager), never copies.
"""
from __future__ import annotations

import sympy
from torch._inductor import ir

__all__ = ["supports", "copy_in_views"]


def supports(inputs, out) -> str | None:
    """Why the lowerings cannot take this copy-in (None when they can).

    They take a 1-D ``all_gather_output`` (what FSDP2 allocates) with every input on its device;
    anything else keeps the previous lowering (stock: the Python fallback).
    """
    if len(out.get_size()) != 1:
        return f"all_gather_output is {len(out.get_size())}-D"
    dev = out.get_device()
    for i, x in enumerate(inputs):
        if x.get_device() != dev:
            return f"all_gather_inputs[{i}] is on {x.get_device()}, the output on {dev}"
    return None


def _view(storage, layout, start, length) -> ir.TensorBox:
    stride = layout.stride[0]
    fixed = ir.FixedLayout(
        layout.device, layout.dtype, [length], [stride], sympy.expand(layout.offset + start * stride)
    )
    return ir.TensorBox(ir.ReinterpretView(data=storage, layout=fixed))


def copy_in_views(out, inp_split_sizes, all_gather_input_numel, rank):
    """``(all_gather_input, dsts)``: the rank's slice of ``out`` and one 1-D view per input.

    Args:
        out: a 1-D TensorBox (realized here; a fresh buffer's layout is frozen).
        inp_split_sizes: element count per input (ints or sympy expressions).
        all_gather_input_numel, rank: as in the op schema.
    """
    out.realize()
    storage, layout = ir.as_storage_and_layout(out, freeze=True)
    base = all_gather_input_numel * rank
    all_gather_input = _view(storage, layout, base, all_gather_input_numel)
    dsts, start = [], base
    for size in inp_split_sizes:
        dsts.append(_view(storage, layout, start, size))
        start = start + size
    return all_gather_input, dsts
