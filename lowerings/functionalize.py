"""Keep eager's order for a foreach copy whose sources read its own destinations.

Stock ``_foreach_copy_`` on CPU is a loop of ``self[i].copy_(src[i])``
(``aten/src/ATen/native/ForeachOpsKernels.cpp``): ``src[i]`` is read after ``self[0..i-1]`` were
written. Functionalization (``FunctionalTensorMode``, used by AOTAutograd) instead reads every
source first, then writes every destination, so ``torch.compile`` silently differs from eager
when ``src[i]`` overlaps ``self[j]`` for some ``j < i`` (checked on torch 2.13: a swap of two
halves of one tensor, or a shift within one buffer).

While the lowerings are active, a ``torch_dispatch`` rule for ``aten._foreach_copy_`` under
``FunctionalTensorMode`` detects that hazard from the tensors' storages, offsets and strides
(without adding shape guards: an overlap it cannot rule out counts as one) and then traces the
stock loop, one ``copy_`` per pair, which functionalization orders correctly. Calls without the
hazard (FSDP's cast into a fresh flat buffer) trace unchanged as one ``_foreach_copy``.
"""
from __future__ import annotations

import logging

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

__all__ = ["install", "may_read_earlier_writes"]

log = logging.getLogger("npu_dispatch.lowerings")
aten = torch.ops.aten
# Beyond this many (source, destination) comparisons in one storage, assume a hazard: the loop
# is always correct, only slower.
_MAX_CHECKS = 100_000


def _extent(t: torch.Tensor):
    """``(storage key, first byte, one past last byte)`` of ``t``, or None when it is empty."""
    if statically_known_true(t.numel() == 0):
        return None
    span = 1
    for size, stride in zip(t.shape, t.stride()):
        span = span + (size - 1) * stride
    item = t.element_size()
    start = t.storage_offset() * item
    return t.untyped_storage()._cdata, start, start + span * item


def may_read_earlier_writes(dsts, srcs) -> bool:
    """True unless no ``srcs[i]`` can overlap a ``dsts[j]`` with ``j < i``."""
    written: dict[int, list[tuple[int, object, object]]] = {}
    for j, d in enumerate(dsts):
        ext = _extent(d)
        if ext is not None:
            written.setdefault(ext[0], []).append((j, ext[1], ext[2]))
    checks = 0
    for i, s in enumerate(srcs):
        ext = _extent(s) if isinstance(s, torch.Tensor) else None
        if ext is None or ext[0] not in written:
            continue
        for j, lo, hi in written[ext[0]]:
            if j >= i:
                break
            checks += 1
            if checks > _MAX_CHECKS:
                return True
            if not (statically_known_true(hi <= ext[1]) or statically_known_true(ext[2] <= lo)):
                return True
    return False


def _rule(mode, func, types, args, kwargs):
    dsts, srcs = args[0], args[1]
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    if not may_read_earlier_writes(dsts, srcs):
        return mode.__torch_dispatch__(func, types, args, kwargs)
    log.info("npu_dispatch.lowerings: _foreach_copy_ of %d pairs reads its own earlier writes: "
             "traced as stock's copy_ loop", len(dsts))
    for d, s in zip(dsts, srcs):
        mode.__torch_dispatch__(aten.copy_.default, types, (d, s, non_blocking), {})
    return None


def install() -> torch.library.Library:
    """Register the rule; ``lib._destroy()`` on the returned library removes it again."""
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    lib = torch.library.Library("aten", "FRAGMENT")
    lib._register_torch_dispatch_rule("_foreach_copy_", FunctionalTensorMode, _rule)
    return lib
