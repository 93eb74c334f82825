"""``explain``: the plan for a copy, without running it."""
from __future__ import annotations

from typing import Sequence

import torch

from . import _native
from ._native_plan import native_plan
from .plan import Plan, build_plan, check_lists

__all__ = ["explain"]


def explain(self: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> Plan:
    """The plan ``_foreach_copy_(self, src)`` would follow under the fast path. Writes nothing.

    The returned :class:`npu_dispatch.plan.Plan` lists the coalesced runs, the foreach groups (with
    device launches), the empty pairs, and for each pair that falls back the reason in words
    (``plan.reasons[i][1]``, e.g. ``"dst[3] is not dense"``); ``print(plan)`` shows it all.

    Raises:
        RuntimeError: stock's list-level errors (empty lists, unequal lengths).
    """
    self, src = list(self), list(src)
    check_lists(self, src)
    # The planner that will run: the C++ one when the native library loads (it takes tensors
    # only; plan.py names the non-tensor).
    if _native.planned_op() is not None and all(isinstance(t, torch.Tensor) for t in self + src):
        return native_plan(self, src)
    return build_plan(self, src)
