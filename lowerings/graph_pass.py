"""Post-grad graph pass: hand the copy-in the values that were scattered, not views of the scatter.

Functionalization turns FSDP's mixed-precision cast ``torch._foreach_copy_(splits_of_flat, shards)``
into a functional ``_foreach_copy`` followed by one ``slice_scatter`` per shard into ``flat``, and
regenerates ``splits_of_flat`` as ``split_with_sizes(scattered_flat)[j]``. Reading piece ``j``
back is exactly the value scattered into that range, so this pass rewires each copy-in input
``split(slice_scatter(...(flat, v_j, 0, a, b)...))[j]`` (or ``slice(..., 0, a, b)``) to ``v_j``
when the range matches exactly and no later scatter overlaps it (same shape, dtype, strides).
The cast then fuses into the copy-in write and the scatter chain becomes dead code. Only inputs
of copy-in nodes are rewired; everything else keeps its graph.

The pass also carries the FX graph cache key of the lowerings: :class:`CopyInPass` is installed
in ``torch._inductor.config.post_grad_custom_post_pass`` while the lowerings are active, and its
``uuid()`` (hash of this package's source plus the strategy) enters Inductor's and
AOTAutograd's cache keys, so a graph compiled without the lowerings is never served with them
active, nor the other way round.
"""
from __future__ import annotations

import operator
import os

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

__all__ = ["CopyInPass", "forward_scattered_splits"]

aten = torch.ops.aten
_COPY_IN = ("fsdp::all_gather_copy_in", "npu_dispatch::all_gather_copy_in")
_SOURCES = tuple(
    sorted(os.path.join(os.path.dirname(__file__), f) for f in os.listdir(os.path.dirname(__file__)) if f.endswith(".py"))
)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _norm(start, end, size):
    """Slice bounds as Python ints clamped like ``aten.slice``; None if symbolic."""
    start = 0 if start is None else start
    end = size if end is None else end
    if not all(type(v) is int for v in (start, end, size)):
        return None
    start = max(0, start + size if start < 0 else start)
    end = min(size, end + size if end < 0 else end)
    return start, max(start, end)


def _piece(node):
    """``(base, start, end)`` when ``node`` reads ``base[start:end]`` along dim 0, else None."""
    if node.op != "call_function":
        return None
    if node.target is aten.slice.Tensor:
        base, dim, start, end, step = (list(node.args) + [0, None, None, 1][len(node.args) - 1:])[:5]
        if dim != 0 or step != 1 or _val(base) is None:
            return None
        bounds = _norm(start, end, _val(base).shape[0])
        return None if bounds is None else (base, *bounds)
    if node.target is not operator.getitem:
        return None
    split, j = node.args
    if split.op != "call_function" or split.target is not aten.split_with_sizes.default:
        return None
    base, sizes = split.args[0], split.args[1]
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    if dim != 0 or not all(type(s) is int for s in sizes):
        return None
    start = sum(sizes[:j])
    return base, start, start + sizes[j]


def _scattered_value(node):
    """The node whose value ``node`` reads back through a slice_scatter chain, or None."""
    piece = _piece(node)
    if piece is None:
        return None
    base, a, b = piece
    want = _val(node)
    while isinstance(base, torch.fx.Node) and base.target is aten.slice_scatter.default:
        inner, src, dim, start, end, step = (list(base.args) + [0, None, None, 1][len(base.args) - 2:])[:6]
        size = _val(inner).shape[0] if _val(inner) is not None and _val(inner).dim() else None
        bounds = _norm(start, end, size) if dim == 0 and step == 1 and size is not None else None
        if bounds is None:
            return None
        s, e = bounds
        if (s, e) == (a, b):
            got = _val(src)
            same = (
                got is not None and want is not None and got.dtype == want.dtype
                and got.shape == want.shape and got.stride() == want.stride()
            )
            return src if same else None
        if e <= a or b <= s:
            base = inner
            continue
        return None
    return None


def forward_scattered_splits(graph: torch.fx.Graph) -> int:
    """Rewire copy-in inputs as described in the module docstring; returns how many moved."""
    moved, dropped = 0, []
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or schema.name not in _COPY_IN:
            continue
        inputs = node.args[0] if node.args else node.kwargs["all_gather_inputs"]
        new = [_scattered_value(x) or x for x in inputs]
        changed = sum(a is not b for a, b in zip(new, inputs))
        if changed:
            if node.args:
                node.args = (new, *node.args[1:])
            else:
                node.kwargs = {**node.kwargs, "all_gather_inputs": new}
            moved += changed
            dropped += [a for a, b in zip(inputs, new) if a is not b]
    _erase_dead(dropped)
    return moved


_PURE_VIEWS = {aten.slice.Tensor, aten.split_with_sizes.default, aten.slice_scatter.default}


def _erase_dead(nodes) -> None:
    """Erase the read-back nodes left without users, and their scatter chains (nothing else)."""
    work, erased = list(nodes), set()
    while work:
        n = work.pop()
        if not isinstance(n, torch.fx.Node) or n in erased or n.users:
            continue
        if n.op != "call_function" or (n.target is not operator.getitem and n.target not in _PURE_VIEWS):
            continue
        work += n.all_input_nodes
        n.graph.erase_node(n)
        erased.add(n)


class CopyInPass(CustomGraphPass):
    """The post-grad pass the lowerings install; see the module docstring."""

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy

    def __call__(self, graph: torch.fx.Graph) -> None:
        forward_scattered_splits(graph)

    def uuid(self):
        return ("npu_dispatch.lowerings", self.strategy, get_hash_for_files(_SOURCES))
