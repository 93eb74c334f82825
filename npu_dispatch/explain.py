"""``explain``: the plan for a copy, without running it."""
from __future__ import annotations

from typing import Sequence

import torch

from . import _native, engine
from ._native_plan import native_plan
from .plan import Plan

__all__ = ["explain"]


def explain(self: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> Plan:
    """The plan ``_foreach_copy_(self, src)`` would follow under the fast path. Writes nothing.

    The returned :class:`npu_dispatch.plan.Plan` lists the coalesced runs, the foreach groups (with
    device launches), the empty pairs, and for each pair that falls back the reason in words
    (``plan.reasons[i][1]``, e.g. ``"dst[3] is not dense"``); ``print(plan)`` shows it all.
    Without the native library every call goes to stock: the plan says so (reason ``no_native``).

    Raises:
        RuntimeError: stock's list-level errors (empty lists, unequal lengths).
        TypeError: an argument is not a list or tuple, or an element is not a Tensor.
    """
    for name, value in (("self", self), ("src", src)):
        if type(value) not in (list, tuple):
            raise TypeError(f"explain(): argument '{name}' must be a list or tuple of Tensors, not {type(value).__name__}")
    self, src = list(self), list(src)
    for name, ts in (("self", self), ("src", src)):
        for i, t in enumerate(ts):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"explain(): {name}[{i}] is a {type(t).__name__}, not a Tensor")
    if _native.planned_op() is None:
        # Stock's list-level checks, on empty meta stand-ins: nothing is read or written, and no
        # mode or counter sees the call (engine.inside: the library's own stock call).
        meta = torch.empty(0, device="meta")
        with engine.inside(), torch._C._DisableTorchDispatch():
            torch._foreach_copy_([meta] * len(self), [meta] * len(src))
        plan = Plan(len(self), launches=len(self), leaves_fast_path=True)
        plan.stock_reason = ("no_native", f"the native library is unavailable ({_native.status()[1]})")
        return plan
    return native_plan(self, src)
