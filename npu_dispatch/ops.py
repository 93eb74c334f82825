"""The ``npu_dispatch`` op library: schemas, kernels, fake kernels and the public wrappers.

Schemas mirror the stock ops exactly (``native_functions.yaml`` ``_foreach_copy_`` and
``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`` ``all_gather_copy_in``), so a caller,
a FakeTensor trace or an Inductor lowering can swap one for the other. Like the stock FSDP op,
``all_gather_copy_in`` carries no alias annotation although it writes ``all_gather_output`` and
returns views of it.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.autograd.forward_ad as _fwad

from . import _native, _op_table, engine
from . import stats as _stats

__all__ = ["foreach_copy_", "all_gather_copy_in", "split_with_sizes_copy", "chunk_cat"]

_lib = torch.library.Library("npu_dispatch", "DEF")
for _row in _op_table.rows():
    if _row.namespace == "npu_dispatch":
        _lib.define(_row.definition)


# The stats of the innermost mode this thread entered, else the counters object itself
# (global_stats() would first drain the C++ kernels' counters). The C++ kernels count in the mode
# whose scope the thread carries, autograd's threads included; these Python kernels count a call
# made on such a thread globally.
_current_stats = _stats.current
# The name each library op counts under, by its engine wrapper (csrc/dispatch/owned_ops.h).
_COUNTED = {row.wrapper: row.counted for row in _op_table.rows() if row.namespace == "npu_dispatch"}


def _foreach_copy_kernel(self: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False) -> None:
    engine.foreach_copy(self, src, non_blocking, stats=_current_stats(), op=_COUNTED["foreach_copy"], bump=None)


def _all_gather_copy_in_kernel(all_gather_inputs, all_gather_output, inp_split_sizes, all_gather_input_numel, rank):
    return engine.all_gather_copy_in(
        all_gather_inputs, all_gather_output, inp_split_sizes, all_gather_input_numel, rank,
        stats=_current_stats(), op=_COUNTED["all_gather_copy_in"], bump=None,
    )


def _split_with_sizes_copy_kernel(all_gather_output, all_gather_input_split_sizes, dim=0, *, out):
    engine.split_with_sizes_copy(all_gather_output, all_gather_input_split_sizes, dim, out, stats=_current_stats(),
                                 op=_COUNTED["split_with_sizes_copy"], bump=None)


def _chunk_cat_kernel(tensors, dim, num_chunks, *, out):
    engine.chunk_cat(tensors, dim, num_chunks, out, stats=_current_stats(), op=_COUNTED["chunk_cat"], bump=None)


# CompositeExplicitAutograd serves every backend with one kernel. Once the native library loads,
# its C++ kernels take the CPU, CUDA and PrivateUse1 keys of foreach_copy_ and all_gather_copy_in
# (csrc/dispatch/register.cpp); these stay for the rest (meta...), where they call the same C++ planner, and
# for machines without a compiler, where they call the stock op (counted as ``no_native``).
# Copy-out and chunk_cat keep these Python kernels everywhere: a stock call they hand on may warn
# (a resized out), and the native entry they call turns C++ warnings into Python ones, which a C++
# kernel reached through torch.ops does not.
_lib.impl("foreach_copy_", _foreach_copy_kernel, "CompositeExplicitAutograd")
_lib.impl("all_gather_copy_in", _all_gather_copy_in_kernel, "CompositeExplicitAutograd")
_lib.impl("split_with_sizes_copy", _split_with_sizes_copy_kernel, "CompositeExplicitAutograd")
_lib.impl("chunk_cat", _chunk_cat_kernel, "CompositeExplicitAutograd")


def _has_tangent(*lists) -> bool:
    """Whether forward-mode AD is on and a tensor carries a tangent (stock has no forward
    formula for ``_foreach_copy_`` and raises). O(1) while forward AD is off."""
    if _fwad._current_level < 0:
        return False
    return any(_fwad.unpack_dual(t).tangent is not None for ts in lists for t in ts)


def _foreach_copy_autograd(self, src, non_blocking=False) -> None:
    # Gradients flow as through stock: when any tensor requires grad, the stock op records the
    # graph (and raises stock's errors, e.g. for an in-place write into a leaf that requires grad);
    # forward-mode tangents get stock's error.
    if (torch.is_grad_enabled() and any(t.requires_grad for t in (*self, *src))) or _has_tangent(self, src):
        torch.ops.aten._foreach_copy_.default(self, src, non_blocking)
        return
    with torch._C._AutoDispatchBelowAutograd():
        torch.ops.npu_dispatch.foreach_copy_.default(self, src, non_blocking)


_lib.impl("foreach_copy_", _foreach_copy_autograd, "Autograd")


@torch.library.register_fake("npu_dispatch::foreach_copy_")
def _foreach_copy_fake(self, src, non_blocking=False):
    # Also the Meta kernel, which a list mixing meta and real tensors dispatches to: the stock op
    # gives both cases their stock semantics (shape checks under FakeTensor, real copies and
    # "Cannot copy out of meta tensor" with real tensors).
    torch.ops.aten._foreach_copy_.default(self, src, non_blocking)
    return None


@torch.library.register_fake("npu_dispatch::all_gather_copy_in")
def _all_gather_copy_in_fake(all_gather_inputs, all_gather_output, inp_split_sizes, all_gather_input_numel, rank):
    all_gather_input = all_gather_output.narrow(0, all_gather_input_numel * rank, all_gather_input_numel)
    return all_gather_input, all_gather_output


@torch.library.register_fake("npu_dispatch::split_with_sizes_copy")
def _split_with_sizes_copy_fake(all_gather_output, all_gather_input_split_sizes, dim=0, *, out):
    # Stock's op on the fake tensors: its shape checks and its resize of a wrongly shaped out.
    torch.split_with_sizes_copy(all_gather_output, all_gather_input_split_sizes, dim, out=out)


@torch.library.register_fake("npu_dispatch::chunk_cat")
def _chunk_cat_fake(tensors, dim, num_chunks, *, out):
    torch._chunk_cat(tensors, dim, num_chunks, out=out)


def _as_list(v):
    """A tuple as the list a ``Tensor[]`` / ``SymInt[]`` argument of torch.ops takes; else as is."""
    return list(v) if type(v) is tuple else v


def _tensor_list(fn: str, name: str, position: int, value):
    """``value`` where the Python binding of a ``Tensor[]`` argument takes it (a list or tuple),
    else the binding's TypeError (``torch._foreach_copy_`` raises it for a tensor, a generator,
    ``None``)."""
    if type(value) not in (list, tuple):
        raise TypeError(f"{fn}(): argument '{name}' (position {position + 1}) must be tuple of Tensors, "
                        f"not {type(value).__name__}")
    return value


def _check_elements(value: list, position: int) -> None:
    """The binding's TypeError for an element that is not a Tensor (``None``, a number...)."""
    for i, t in enumerate(value):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected Tensor as element {i} in argument {position}, but got {type(t).__name__}")


def foreach_copy_(
    self: Sequence[torch.Tensor], src: Sequence[torch.Tensor], non_blocking: bool = False
) -> list[torch.Tensor]:
    """``torch._foreach_copy_`` through the fast path: ``self[i].copy_(src[i])`` for every i.

    Args:
        self: destinations, any devices, dtypes and layouts stock accepts.
        src: sources, same length; each broadcastable to its destination.
        non_blocking: passed to every copy that leaves the fast path, as stock does.

    Results, errors (type and message) and version-counter bumps are those of the stock op; see
    ``npu_dispatch.plan`` for which pairs take the fast path. Counted in the stats of the
    ``NpuFastCopyMode`` entered, else in ``npu_dispatch.stats.global_stats()``.

    Returns:
        ``self`` as a list, as the Python binding of ``torch._foreach_copy_`` does.

    Raises:
        TypeError: as stock's binding: an argument that is not a list or tuple, or an element that
            is not a Tensor.
        RuntimeError: as stock (empty lists, unequal lengths, shapes that do not broadcast...).
    """
    # Lists pass as they are (the C++ entry reads them in place), tuples are copied once; anything
    # else gets the stock binding's TypeError, before anything is written.
    if type(self) is not list:
        self = list(_tensor_list("foreach_copy_", "self", 0, self))
    if type(src) is not list:
        src = list(_tensor_list("foreach_copy_", "src", 1, src))
    # The direct entry's gate (csrc/binding/direct_entry.cpp unobserved(): modes, forward AD, extra
    # dispatch keys such as the JIT tracer's) and the one-pass plan's checks (requires_grad...) run in
    # C++; a compiler recording this function is the one thing C++ cannot see. These lines are the
    # whole Python cost of a call the one-pass plan takes, so they read the loaded entry directly.
    direct = _native._direct if _native._direct is not None else _native.direct_op()
    if direct is not None and not torch.compiler.is_compiling() and direct(self, src, non_blocking):
        return self
    # The one-pass plan refused the call: now (off the fast path) check each element as the binding does.
    _check_elements(self, 0)
    _check_elements(src, 1)
    if torch._C._get_tracing_state():
        # The JIT tracer records no call of a custom op that returns nothing; stock's per-pair
        # copy_ calls it records, with the same result.
        torch._foreach_copy_(self, src, non_blocking=non_blocking)
        return self
    # Everything else through the dispatcher: autograd, modes and compilers see the op, and its
    # C++ kernel plans it (counted in the mode entered, if any).
    torch.ops.npu_dispatch.foreach_copy_.default(self, src, non_blocking)
    return self


def all_gather_copy_in(
    all_gather_inputs: Sequence[torch.Tensor],
    all_gather_output: torch.Tensor,
    inp_split_sizes: Sequence[int],
    all_gather_input_numel: int,
    rank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.fsdp.all_gather_copy_in`` through the fast path.

    Args:
        all_gather_inputs: this rank's 1-D shards, ``sum(inp_split_sizes) == all_gather_input_numel``
            elements in all, any dtype castable to ``all_gather_output``'s.
        all_gather_output: 1-D buffer of ``world_size * all_gather_input_numel`` elements.
        inp_split_sizes: element count of each shard.
        all_gather_input_numel: elements per rank.
        rank: this rank; its slice starts at ``all_gather_input_numel * rank``.

    Returns:
        ``(all_gather_input, all_gather_output)``: this rank's slice (a view) and the output.

    Raises:
        RuntimeError / IndexError: as stock ``narrow`` / ``split`` / ``_foreach_copy_``.
    """
    # Tuples become lists; anything else reaches the op as it is, which raises as stock's does.
    return torch.ops.npu_dispatch.all_gather_copy_in.default(
        _as_list(all_gather_inputs), all_gather_output, _as_list(inp_split_sizes), all_gather_input_numel, rank)


def split_with_sizes_copy(
    all_gather_output: torch.Tensor,
    all_gather_input_split_sizes: Sequence[int],
    dim: int = 0,
    *,
    out: Sequence[torch.Tensor],
) -> None:
    """``torch.ops.fsdp.split_with_sizes_copy`` (FSDP2's all-gather copy-out) through the fast path:
    ``out[i]`` gets ``all_gather_output.split_with_sizes(all_gather_input_split_sizes, dim)[i]``.

    FSDP2 calls it as ``(all_gather_output.view(world_size, -1), sizes, dim=1, out=[param.view(
    world_size, -1) ...])``: ``world_size * len(out)`` contiguous rows. Served (one CPU kernel pass;
    on npu, a batched ``_foreach_copy_`` of the rows) where ``all_gather_output`` and every ``out[i]``
    are contiguous, of one dtype and device, each ``out[i]`` of exactly its split's shape and nothing
    overlapping; everything else is stock's ``torch.split_with_sizes_copy``, with its errors, its
    resize (and warning) of a wrongly shaped ``out[i]`` and its writes. Each ``out[i]``'s version
    counter moves as stock's does (once; none inside inference_mode
    when every tensor of the call is an inference tensor).

    Args:
        all_gather_output: the tensor to split, any dtype and device.
        all_gather_input_split_sizes: sizes along ``dim``, summing to ``all_gather_output.size(dim)``.
        dim: the dimension split (negative counts from the end).
        out: one destination per size.

    Raises:
        RuntimeError: as stock's ``split_with_sizes_copy`` (sizes that do not sum, a wrong dtype or
            device of ``out[i]``, a wrong number of outputs...).
    """
    # The loaded module read directly, as foreach_copy_ reads its entry: these lines are the whole
    # Python cost of a call the direct entry serves.
    module = _native._module if _native._module is not None else _native.module()
    if (module is not None and not torch.compiler.is_compiling()
            and module.copy_out_direct(all_gather_output, all_gather_input_split_sizes, dim, out)):
        return
    torch.ops.npu_dispatch.split_with_sizes_copy.default(all_gather_output, _as_list(all_gather_input_split_sizes),
                                                         dim, out=_as_list(out))


def chunk_cat(tensors: Sequence[torch.Tensor], dim: int, num_chunks: int, *, out: torch.Tensor) -> None:
    """``torch.ops.fsdp.chunk_cat`` (FSDP2's reduce-scatter copy-in) through the fast path, as
    ``torch._chunk_cat(tensors, dim, num_chunks, out=out)``: each tensor zero-padded along ``dim``
    to a multiple of ``num_chunks``, viewed as ``[..., num_chunks, -1]``, and concatenated along
    ``dim + 1`` into ``out``, cast to ``out``'s dtype (FSDP2: bf16 gradients into an fp32
    ``[world_size, -1]`` reduce-scatter input).

    Served on the CPU (one kernel pass with the cast and the padding inside; on other devices the
    device's own op, one call, keeps it) where every tensor is contiguous, ``out`` is contiguous of
    exactly the result's shape, the cast keeps one dtype or widens (bf16 / fp16 -> fp32: stock's
    cat narrows with other NaN bits than copy_) and ``out`` overlaps no input (inputs may overlap
    each other); everything else is stock's ``torch._chunk_cat``, with its errors, resize warning
    and writes. ``out``'s version counter moves as stock's does (once; none inside inference_mode
    when every tensor of the call is an inference tensor).

    Args:
        tensors: non-empty tensors of one dtype and device; sizes before ``dim`` equal.
        dim: the dimension chunked (negative only where all tensors have the same ndim).
        num_chunks: chunks per tensor (FSDP2: the world size), at least 1.
        out: the result, ``[*sizes before dim, num_chunks, sum of chunk widths]``.

    Raises:
        RuntimeError: as stock's ``_chunk_cat`` ("_chunk_cat expects ..." messages).
    """
    module = _native._module if _native._module is not None else _native.module()  # as above
    if module is not None and not torch.compiler.is_compiling() and module.chunk_cat_direct(tensors, dim, num_chunks, out):
        return
    torch.ops.npu_dispatch.chunk_cat.default(_as_list(tensors), dim, num_chunks, out=out)
