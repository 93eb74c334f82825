"""The C++ planner's plans as :class:`~npu_dispatch.plan.Plan` objects, with their reason texts.

C++ sends each plan as a dict of pair indices and reason-kind names (csrc/binding/to_python.h);
everything shown to a person (devices, dtypes, shapes, reason texts) is rebuilt here from the
tensors themselves, with the words of ``plan.py``.
"""
from __future__ import annotations

from typing import Sequence

import torch

from . import _native, capabilities
from .plan import (Group, Plan, Run, Stage, _dt, _empty_write_text, _inference_text, _lazy_bit_dst_text, _odd_dtype_text,
                   _whole_list_text, _zero_dim_cast_text)

__all__ = ["decode_plan", "native_plan"]


_OWN_OP = "the device's own _foreach_copy_ takes the whole call"


def _stock_text(kind: str, a: int, b: int, detail: str, dsts, srcs, own_op: bool, no_fast_pair: bool) -> str:
    """Why the whole call is stock's; ``detail``: the side or variant of the reason C++ names
    (csrc/planner/classify.h sub_name); ``own_op``: a device whose own op takes it whole; ``no_fast_pair``:
    because no pair has a fast path, ``kind`` the first fallback pair's reason (planner/plan.h)."""
    if no_fast_pair:
        return f"no pair has a fast path ({_fallback_text(kind, a, detail, dsts[a], srcs[a])}, the first): {_OWN_OP}"
    text = _stock_reason_text(kind, a, b, detail, dsts, srcs, own_op)
    if own_op and _OWN_OP not in text:
        text = f"{text}; {_OWN_OP}"
    return text


def _stock_reason_text(kind: str, a: int, b: int, detail: str, dsts, srcs, own_op: bool) -> str:
    if kind in ("no_storage", "subclass"):
        bad = dsts[a] if detail == "dst" else srcs[a]
        if kind == "no_storage":
            return f"{detail}[{a}] has no storage ({bad.device.type} tensor)"
        if type(bad) is torch.Tensor:
            return f"{detail}[{a}] is a wrapper tensor (functional, batched, zero or nested)"
        return f"{detail}[{a}] is a tensor subclass ({type(bad).__name__})"
    d, s = dsts[a], srcs[a]
    if kind == "layout":
        return f"pair {a} has layout {d.layout if detail == 'dst' else s.layout}"
    if kind == "meta":
        return f"pair {a} has a meta tensor"
    if kind == "may_raise":
        if detail == "no_broadcast":
            return (
                f"src[{a}] shape {tuple(s.shape)} does not broadcast to dst[{a}] shape "
                f"{tuple(d.shape)}: stock raises there, after writing the pairs before it"
            )
        if detail == "odd_dtype":
            return _odd_dtype_text(a, s.dtype, d.dtype)
        if detail == "inference":
            return _inference_text(a)
        if detail == "empty_write":
            return _empty_write_text(a)
        return f"dst[{a}] has internal overlap: stock raises there"
    if kind == "conj_neg":
        # A destination's lazy bit: stock's dispatcher refuses the list (a source's is a pair off
        # the fast path, below).
        return _lazy_bit_dst_text(a)
    if kind == "order_dependent":
        return _zero_dim_cast_text(a, s.dtype, d.dtype)
    if kind == "whole_list_op":  # detail: the side of the tensor on the whole_list_only device
        t = d if detail == "dst" else s
        cap = capabilities.lookup(t.device.type)
        return _whole_list_text(cap.name if cap is not None else t.device.type)
    if kind == "aliasing":
        later, earlier = detail.split("_over_")
        overlap = f"{later}[{b}] overlaps {earlier}[{a}]"
        return f"{overlap}; {_OWN_OP}" if own_op else f"{overlap}: kept as stock's sequential copy_ loop"
    return kind


def _fallback_text(kind: str, i: int, detail: str, d: torch.Tensor, s: torch.Tensor) -> str:
    if kind == "broadcast":
        return f"src[{i}] shape {tuple(s.shape)} broadcasts to dst[{i}] shape {tuple(d.shape)}"
    if kind == "device":
        return f"src[{i}] on {s.device}, dst[{i}] on {d.device}"
    if kind == "not_dense":
        return f"{detail}[{i}] is not dense"
    if kind == "strides":
        return f"src[{i}] strides {s.stride()} differ from dst[{i}] strides {d.stride()}"
    if kind == "conj_neg":
        return f"pair {i} has a lazy conjugate or negative bit"
    if kind == "dtype":
        if detail == "complex_to_real":
            return f"pair {i} casts complex to real (stock warns per copy)"
        cap = capabilities.lookup(d.device.type)
        name = cap.name if cap is not None else d.device.type
        return f"dtype pair {_dt(s.dtype)}->{_dt(d.dtype)} not supported by the {name} fast path"
    if kind == "no_capability":
        return f"no fast path for device type {d.device.type}"
    return kind


def decode_plan(d: dict, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> Plan:
    """The :class:`Plan` for the dict ``npu_dispatch::plan`` returns (csrc/binding/to_python.h)."""
    plan = Plan(d["n"])
    if d["stock"] is not None:
        # As in plan.py, pairs classified before the whole-stock decision stay listed.
        kind = d["stock"]
        plan.stock_reason = (kind, _stock_text(kind, d["stock_a"], d["stock_b"], d["stock_detail"], dsts, srcs,
                                               d["own_op"], d["no_fast_pair"]))
    plan.launches = d["launches"]
    plan.leaves_fast_path = d["leaves_fast_path"]
    for idx, numel in d["runs"]:
        d0, s0 = dsts[idx[0]], srcs[idx[0]]
        plan.runs.append(Run(idx, numel, d0.device, s0.dtype, d0.dtype))
    for idx, launches, transfer in d["groups"]:
        d0, s0 = dsts[idx[0]], srcs[idx[0]]
        plan.groups.append(Group(idx, d0.device, s0.dtype, d0.dtype, launches, transfer, s0.device))
    for idx, numel, adjacent, launches in d["stages"]:
        d0, s0 = dsts[idx[0]], srcs[idx[0]]
        plan.stages.append(Stage(idx, numel, d0.device, s0.dtype, d0.dtype, adjacent, launches))
    for i, kind, detail in d["fallback"]:
        plan.fallback.append(i)
        plan.reasons[i] = (kind, _fallback_text(kind, i, detail, dsts[i], srcs[i]))
    plan.empty = list(d["empty"])
    plan.fallback_launches = d["fallback_launches"]
    return plan


def native_plan(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> Plan:
    """The C++ planner's plan for ``_foreach_copy_(dsts, srcs)`` (native library loaded)."""
    return decode_plan(_native.module().plan(dsts, srcs), dsts, srcs)
