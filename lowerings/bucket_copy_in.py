"""The bucketed all-gather copy-in, lowered so the cast is fused into the write into the bucket.

Inductor's collective bucketing (``torch/_inductor/fx_passes/bucketing.py``, config
``bucket_all_gathers_fx``) merges the all-gathers of a bucket into one. Its copy-in, which
SimpleFSDP's parameters (fp32 shards cast to bf16) all go through, comes in two forms:

- bucket mode ``"default"`` (``all_gather_merge_fn_to_trace``): ``out = empty(world * n)``,
  ``dst = out[n * rank : n * (rank + 1)]``, ``dst.copy_(cat([s.reshape(-1) for s in shards]))``.
  The bucketing pass folds each shard's ``convert_element_type`` into that ``copy_``, so ``cat``
  reads the fp32 shards. Stock Inductor writes them into a bucket-sized fp32 temporary
  (``ConcatKernel``) and casts that in a second pass.
- bucket modes ``"custom_ops"`` / ``"custom_ops_multidtype"``: one
  ``bucketing::_pre_bucket_all_gather(shards, world, dtype, out_dtypes, rank, groups)``, a Python
  op that runs one eager ``_foreach_copy_`` per group of shapes.

Both lower here to one write per shard straight into its slice of the bucket, the cast inlined
(strategy ``fused``), or one extern ``npu_dispatch::foreach_copy_`` of the shards into those
slices (strategy ``native``). The values written are the stock op's: ``cat`` promotes to its
result dtype first, then ``copy_`` casts, and the lowering casts in the same two steps.
"""
from __future__ import annotations

import logging
import operator

import torch
from torch._inductor import lowering as L
from torch._inductor.virtualized import V

from . import strategy as _strategy
from .views import slices
from .writes import extern_foreach_copy, write_all

__all__ = ["match_cat_copy", "lower_cat", "lower_pre_bucket_all_gather"]

log = logging.getLogger("npu_dispatch.lowerings")
aten = torch.ops.aten


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is_view(node: torch.fx.Node) -> bool:
    """Whether ``node``'s output aliases its first argument (a view op, or an item of one)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return isinstance(node.args[0], torch.fx.Node) and _is_view(node.args[0])
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns or not schema.arguments:
        return False
    ret, arg = schema.returns[0].alias_info, schema.arguments[0].alias_info
    return ret is not None and not ret.is_write and arg is not None


def _root(node):
    """The node whose storage ``node`` views (itself if it is no view)."""
    while isinstance(node, torch.fx.Node) and _is_view(node):
        node = node.args[0]
    return node


def match_cat_copy(cat: torch.fx.Node):
    """The ``(copy_, dst)`` nodes when ``cat`` is a default-mode bucket copy-in, else None.

    Matches ``dst.copy_(cat(xs))`` where every ``x`` and ``dst`` are 1-D, ``cat``'s only user is
    that ``copy_``, no input shares ``dst``'s storage, and no node between ``cat`` and ``copy_``
    reads or writes that storage (the lowering writes at ``cat``'s place in the graph).
    """
    if cat.op != "call_function" or cat.target is not aten.cat.default:
        return None
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    inputs = cat.args[0]
    if dim not in (0, -1) or len(cat.users) != 1:
        return None
    (cp,) = cat.users
    if cp.op != "call_function" or cp.target is not aten.copy_.default or len(cp.args) < 2 or cp.args[1] is not cat:
        return None
    dst = cp.args[0]
    vals = [_val(x) for x in inputs]
    dv, cv = _val(dst), _val(cat)
    if dv is None or cv is None or dv.dim() != 1 or tuple(dv.shape) != tuple(cv.shape) or dv.device != cv.device:
        return None
    if any(v is None or v.dim() != 1 or v.device != dv.device for v in vals):
        return None
    root = _root(dst)
    if any(_root(x) is root for x in inputs):
        return None
    n = cat.next
    while n is not cp:
        if n.op == "output" or any(_root(a) is root for a in n.all_input_nodes):
            return None
        n = n.next
    return cp, dst


def _copy(kind: str, requested: str, dsts, xs, promote_to=None) -> None:
    """Copy ``xs`` into ``dsts`` (each cast to its destination's dtype): Inductor writes, or one
    extern call (``strategy.choose``). ``promote_to``: a dtype each ``x`` is cast to first (``cat``'s
    promotion); the extern call takes only lists that need no such step."""
    chosen = _strategy.choose(requested, dsts[0].get_device(), len(xs), kind)
    if chosen == "native" and (promote_to is None or all(x.get_dtype() == promote_to for x in xs)):
        extern_foreach_copy(dsts, xs)
        return
    write_all(dsts, xs if promote_to is None else [L.to_dtype(x, promote_to) for x in xs])


def lower_cat(prev, requested):
    """Our ``aten.cat.default`` lowering: the bucket copy-in (``match_cat_copy``) is written
    straight into ``dst`` and ``dst`` itself is returned, so the ``copy_`` after it, given
    ``dst.copy_(dst)``, writes nothing (upstream's ``copy_`` lowering returns early on
    ``dst is src``). Every other ``cat`` is ``prev``'s."""

    def cat(inputs, dim=0):
        node = V.graph.current_node
        m = match_cat_copy(node) if node is not None else None
        dst_box = V.graph.env.get(m[1]) if m is not None else None
        if dst_box is None or len(inputs) != len(node.args[0]):
            return prev(inputs, dim)
        xs = [x for x in inputs if not V.graph.sizevars.statically_known_equals(x.get_numel(), 0)]
        if xs:
            dsts = slices(dst_box, 0, [x.get_numel() for x in xs])
            _copy("bucket copy-in (cat + copy_)", requested(), dsts, xs, _val(node).dtype)
        return dst_box

    return cat


def lower_pre_bucket_all_gather(prev, requested):
    """Our lowering of ``bucketing::_pre_bucket_all_gather`` (schema in the module docstring).

    Returns a new 1-D buffer of ``group_size * n`` elements of ``dtype`` whose slice at
    ``n * rank`` holds the inputs, each cast to ``dtype``; the rest is uninitialised, as the
    op's ``torch.empty``. Mixed ``out_dtypes`` (each input bit-viewed into the bucket, mode
    ``custom_ops_multidtype``) keep ``prev``.
    """

    def pre_bucket_all_gather(ag_ins, group_size, dtype, out_dtype_ints, rank, foreach_group_indices=None):
        from torch._inductor.fx_passes.bucketing import _ALL_DTYPES

        device = ag_ins[0].get_device()
        why = None
        if any(_ALL_DTYPES[d] != dtype for d in out_dtype_ints):
            why = "an input is bit-viewed into the bucket (out_dtypes differ from the bucket's dtype)"
        elif any(x.get_device() != device for x in ag_ins):
            why = "inputs on more than one device"
        if why is not None:
            log.info("npu_dispatch.lowerings: _pre_bucket_all_gather kept stock: %s", why)
            return prev(ag_ins, group_size, dtype, out_dtype_ints, rank, foreach_group_indices)
        sizes = [x.get_numel() for x in ag_ins]
        numel = sum(sizes)
        out = L.empty_strided([numel * group_size], [1], dtype=dtype, device=device)
        keep = [i for i, s in enumerate(sizes) if not V.graph.sizevars.statically_known_equals(s, 0)]
        if keep:
            starts = [sum(sizes[:i]) for i in keep]
            dsts = [slices(out, numel * rank + s, [sizes[i]])[0] for s, i in zip(starts, keep)]
            xs = [L.view(ag_ins[i], [sizes[i]]) for i in keep]
            _copy("bucket copy-in (_pre_bucket_all_gather)", requested(), dsts, xs)
        return out

    return pre_bucket_all_gather
