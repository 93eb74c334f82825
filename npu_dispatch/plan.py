"""The copy planner: decides, for one ``_foreach_copy_(dsts, srcs)``, which pairs take which path.

Paths, in the order the executor issues them:
- ``coalesced``: a *run* of consecutive pairs whose destinations are contiguous and adjacent in one
  storage, and whose sources are too, with one dtype pair: one flat ``copy_`` (FSDP's copy-in).
- ``foreach``: the remaining fast-route pairs, grouped by (device, src dtype, dst dtype); each
  group goes to the device's native batched kernel (ATen ``_foreach_copy_``).
- ``fallback``: pairs off the fast route (broadcast, other device, strides, dtype pair not in the
  capability table...): stock ``_foreach_copy_`` on just those pairs, with the caller's
  ``non_blocking``.
- ``stock``: the whole call keeps stock's semantics. When reordering could change the result (a
  destination overlaps another tensor of the call, or a 0-dim conversion, whose bits in stock depend
  on the copies before it) or stock could raise midway, it runs as stock's
  CPU kernel does, a sequential ``copy_`` loop bumping each destination as it goes, so the same
  pairs are written (and bumped) before the same error; meta tensors too. Tensor subclasses,
  wrapper tensors and other layouts go to the stock op itself.
- ``empty``: zero-element pairs; stock ``copy_`` does nothing for them either.

Fast-route rules mirror ATen ``can_use_fast_route`` (``aten/src/ATen/native/ForeachUtils.h``):
same device, strided, non-overlapping and dense, equal sizes, equal strides except on size-1 dims.
Because no destination overlaps any other tensor of the call, and a call with a pair that may
raise stays whole on stock, the order in which paths run cannot change a single bit of the result.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import torch

from . import capabilities

__all__ = ["Plan", "Run", "Group", "build_plan", "check_lists", "lazy_bit_dst"]

_Tensor = torch.Tensor
_strided = torch.strided

_NO_DISPATCH = torch._C._disabled_torch_dispatch_impl


def _own_dispatch(t) -> bool:
    """Whether ``t``'s type has a ``__torch_dispatch__`` of its own (DTensor, FakeTensor...): then
    the whole call stays stock. A Parameter or a ``__torch_function__``-only subclass is plain."""
    kind = type(t)
    return kind is not _Tensor and kind.__torch_dispatch__ is not _NO_DISPATCH

# Dtypes whose copy_ never raises between each other. Others (quantized, bits, float8, uint16+,
# complex32...) can raise for some pairs, after stock wrote the pairs before: whole call to stock.
_COPY_DTYPES = capabilities.COPY_DTYPES


# Stock's error for an in-place write into an inference tensor outside inference_mode (checked by
# autograd, which the fast path runs below, so the stock loop raises it itself).
INFERENCE_WRITE_ERROR = (
    "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone "
    "to get a normal tensor before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 "
    "for more details."
)


def _inference_text(i: int) -> str:
    return (f"dst[{i}] has no version counter (an inference tensor, or one that took an inference "
            "tensor's place through .data) outside inference_mode: stock raises there, after "
            "writing it")


def _empty_write_text(i: int) -> str:
    return (f"dst[{i}] is empty and its storage refuses its data pointer or is copy-on-write: stock's "
            "copy_ raises or materializes it there, after writing the pairs before it")


def _empty_write_refused(d: torch.Tensor) -> bool:
    """Whether stock's ``copy_`` into the empty ``d`` would raise or copy a storage: it asks for even
    an empty destination's mutable pointer (TensorIterator, after ``copy_impl``'s early return for
    the same data), which raises where the storage is flagged (``_set_throw_on_mutable_data_ptr``:
    FakeTensor, FunctionalTensor) and materializes a copy-on-write one. Asks for it the same way,
    so a storage flagged to warn warns here, once per process, also where stock would stop or
    return before reaching the pair (a known difference). Mirrors csrc/storage_write.h."""
    try:
        # Raises too where the storage was released (its access error).
        if torch._C._is_cow_tensor(d):
            return True
        d.data_ptr()
    except RuntimeError:
        return True
    return False


def _no_version_counter(t: torch.Tensor) -> bool:
    """Whether stock's version bump finds no counter on ``t`` (and raises outside inference_mode):
    an inference tensor, or one made in inference_mode and given another tensor's ``.data``
    (plain keys, ``is_inference()`` False). A normal tensor given an inference tensor's
    ``.data`` keeps its counter (``is_inference()`` True)."""
    try:
        t._version
    except RuntimeError:
        return True
    return False


def _odd_dtype_text(i: int, sdt: torch.dtype, ddt: torch.dtype) -> str:
    return (
        f"pair {i} copies {_dt(sdt)}->{_dt(ddt)}: stock copy_ may raise for that dtype, "
        "after writing the pairs before it"
    )


def _lazy_bit_dst_text(i: int) -> str:
    return (
        f"dst[{i}] has a lazy conjugate or negative bit: stock refuses such a mutable list "
        "before writing, so the call goes to the stock op"
    )


def _zero_dim_cast_text(i: int, sdt: torch.dtype, ddt: torch.dtype) -> str:
    # torch 2.13's CPU copy (reduced_float_type_copy, aten/src/ATen/native/cpu/CopyKernel.cpp)
    # reads strides(0)[0] of a TensorIterator with no dimensions: stale stack memory, which the
    # copies before it left (valgrind: "uninitialised value(s) ... created by a stack allocation
    # at copy_impl"). It picks the vectorized fp32 -> bf16 loop (a NaN becomes 0xffff) or the
    # scalar one (0x7fc0): 0xffff right after an fp32 -> bf16 pair of the same _foreach_copy_,
    # even an empty one. Stock's own loop, issued above ADInplaceOrView as stock issues it,
    # reproduces that; where the caller's stack decides, either can come out
    # (docs/stock_quirks.md).
    return (
        f"pair {i} converts a 0-dim {_dt(sdt)} into {_dt(ddt)}: stock's bits for it depend on the "
        "copies before it, so the call runs as stock's sequential copy_ loop"
    )


def lazy_bit_dst(dsts: Sequence) -> int | None:
    """Index of the first destination with a lazy conjugate or negative bit, or None.

    Stock's dispatcher (the Conjugate and Negative fallbacks) refuses a mutable list holding one,
    before its kernel checks the lists or writes anything; the stock op raises that error.
    """
    for i, d in enumerate(dsts):
        if isinstance(d, _Tensor) and (d.is_conj() or d.is_neg()):
            return i
    return None


def check_lists(dsts: Sequence, srcs: Sequence) -> None:
    """List-level checks of ATen ``check_foreach_api_restrictions``, with its exact messages.

    Raises:
        RuntimeError: an empty list, or lists of unequal length. Nothing is written.
    """
    if len(dsts) == 0 or len(srcs) == 0:
        raise RuntimeError("Tensor list must have at least one tensor.")
    if len(dsts) != len(srcs):
        raise RuntimeError(
            f"Tensor lists must have the same number of tensors, got {len(dsts)} and {len(srcs)}"
        )


@dataclasses.dataclass
class Run:
    """A coalesced span: pairs ``indices`` become one flat copy of ``numel`` elements."""

    indices: list[int]
    numel: int
    device: torch.device
    src_dtype: torch.dtype
    dst_dtype: torch.dtype


@dataclasses.dataclass
class Group:
    """Fast-route pairs of one (device, src dtype, dst dtype), sent to the native kernel."""

    indices: list[int]
    device: torch.device
    src_dtype: torch.dtype
    dst_dtype: torch.dtype
    launches: int


@dataclasses.dataclass
class Plan:
    """What the executor will do for one call; ``str(plan)`` is the human-readable form.

    ``reasons`` maps a fallback pair index to ``(kind, text)``; ``stock_reason`` is set when the
    whole call goes to the stock op.
    """

    n: int
    runs: list[Run] = dataclasses.field(default_factory=list)
    groups: list[Group] = dataclasses.field(default_factory=list)
    fallback: list[int] = dataclasses.field(default_factory=list)
    empty: list[int] = dataclasses.field(default_factory=list)
    reasons: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)
    stock_reason: tuple[str, str] | None = None
    fallback_launches: int = 0

    @property
    def launches(self) -> int:
        """Device launches the call issues (coalesced runs count one each)."""
        if self.stock_reason is not None:
            return self.n
        return len(self.runs) + sum(g.launches for g in self.groups) + self.fallback_launches

    def __str__(self) -> str:
        lines = [f"plan for {self.n} pair(s): {self.launches} device launch(es)"]
        if self.stock_reason is not None:
            lines.append(f"  whole call -> stock: {self.stock_reason[1]}")
            return "\n".join(lines)
        for r in self.runs:
            lines.append(
                f"  coalesced run pairs {_span(r.indices)}: 1 flat copy of {r.numel} elements "
                f"{_dt(r.src_dtype)}->{_dt(r.dst_dtype)} on {r.device}"
            )
        for g in self.groups:
            lines.append(
                f"  foreach group pairs {_span(g.indices)} ({len(g.indices)} tensors) "
                f"{_dt(g.src_dtype)}->{_dt(g.dst_dtype)} on {g.device}: {g.launches} launch(es)"
            )
        if self.empty:
            lines.append(f"  empty pairs {_span(self.empty)}: nothing to copy")
        for i in self.fallback:
            lines.append(f"  fallback pair {i}: {self.reasons[i][1]}")
        return "\n".join(lines)


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _span(indices: list[int]) -> str:
    if len(indices) > 1 and indices[-1] - indices[0] == len(indices) - 1:
        return f"{indices[0]}..{indices[-1]}"
    if len(indices) > 8:
        return ", ".join(map(str, indices[:8])) + f", ... ({len(indices)} in all)"
    return ", ".join(map(str, indices))


# The address without materializing a copy-on-write tensor. Tensor.const_data_ptr is not in the
# Python API of every torch the package allows; data_ptr() stands in there (it may materialize a
# copy-on-write tensor, and raises on a source that forbids mutable access where stock copies it;
# only torch 2.13 is tested).
_ptr = getattr(_Tensor, "const_data_ptr", None) or _Tensor.data_ptr


def _dense(t: _Tensor) -> bool:
    """ATen ``is_non_overlapping_and_dense``: strides are a permutation of a contiguous layout."""
    if t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last):
        return True
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def _same_strides(d: _Tensor, s: _Tensor) -> bool:
    return all(sz == 1 or a == b for sz, a, b in zip(d.shape, d.stride(), s.stride()))


def _span_bytes(t: _Tensor) -> int:
    return (sum((sz - 1) * st for sz, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _in_one_storage(t: _Tensor, nbytes: int) -> bool:
    """Whether ``nbytes`` from ``t``'s first element stay inside ``t``'s own storage.

    Adjacent addresses alone are not enough: two allocations can sit side by side (the CUDA and
    NPU caching allocators split one segment), and a flat view must not leave its storage.
    """
    base = _ptr(t) - t.storage_offset() * t.element_size()
    return _ptr(t) + nbytes <= base + t.untyped_storage().nbytes()


def _first_overlap(
    intervals: list[tuple[str, int, int, int, bool]]
) -> tuple[int, bool, int, bool] | None:
    """First (index, is_dst) pair of intervals that overlap where at least one is a destination.

    ``intervals`` holds ``(device, start, end, index, is_dst)`` in bytes of absolute address.
    Sorted by start, an interval overlaps an earlier one exactly when it starts before the largest
    end seen so far on its device.
    """
    intervals.sort()
    device = None
    end_all = end_dst = -1
    who_all = who_dst = None
    for dev, start, end, i, is_dst in intervals:
        if dev != device:
            device, end_all, end_dst, who_all, who_dst = dev, -1, -1, None, None
        if is_dst and start < end_all:
            return (*who_all, i, True)
        if not is_dst and start < end_dst:
            return (*who_dst, i, False)
        if end > end_all:
            end_all, who_all = end, (i, is_dst)
        if is_dst and end > end_dst:
            end_dst, who_dst = end, (i, True)
    return None


def _name(i: int, is_dst: bool) -> str:
    return f"{'dst' if is_dst else 'src'}[{i}]"


def build_plan(
    dsts: Sequence[_Tensor],
    srcs: Sequence[_Tensor],
    lookup: Callable[[str], capabilities.Capability | None] = capabilities.lookup,
) -> Plan:
    """Plan ``_foreach_copy_(dsts, srcs)`` without touching any data.

    Args:
        dsts, srcs: equal-length, non-empty lists (call ``check_lists`` first).
        lookup: capability table access, ``capabilities.lookup`` unless a test injects one.

    Returns:
        The :class:`Plan`; every pair is in exactly one of runs, groups, fallback or empty,
        or ``stock_reason`` is set.
    """
    n = len(dsts)
    plan = Plan(n)
    intervals: list[tuple[str, int, int, int, bool]] = []
    fast: list[int] = []  # pair indices on the fast route, in index order
    caps: dict[str, capabilities.Capability | None] = {}

    def stock(kind: str, text: str) -> Plan:
        plan.stock_reason = (kind, text)
        return plan

    lazy = lazy_bit_dst(dsts)
    if lazy is not None:
        return stock("conj_neg", _lazy_bit_dst_text(lazy))
    whole = _whole_list_capability(dsts, srcs, lookup)
    if whole is not None:
        return _whole_list_plan(plan, dsts, srcs, whole)

    for i in range(n):
        d, s = dsts[i], srcs[i]
        if not isinstance(d, _Tensor) or not isinstance(s, _Tensor):
            bad, who = (d, "dst") if not isinstance(d, _Tensor) else (s, "src")
            return stock("not_tensor", f"{who}[{i}] is a {type(bad).__name__}, not a Tensor")
        if _own_dispatch(d) or _own_dispatch(s):
            bad, who = (d, "dst") if _own_dispatch(d) else (s, "src")
            return stock("subclass", f"{who}[{i}] is a tensor subclass ({type(bad).__name__})")
        if d.is_nested or s.is_nested:
            who = "dst" if d.is_nested else "src"
            return stock("subclass", f"{who}[{i}] is a wrapper tensor (functional, batched, zero or nested)")
        if d.layout is not _strided or s.layout is not _strided:
            lay = d.layout if d.layout is not _strided else s.layout
            return stock("layout", f"pair {i} has layout {lay}")
        dd, sd = d.device, s.device
        if dd.type == "meta" or sd.type == "meta":
            return stock("meta", f"pair {i} has a meta tensor")
        if d.dtype not in _COPY_DTYPES or s.dtype not in _COPY_DTYPES:
            return stock("may_raise", _odd_dtype_text(i, s.dtype, d.dtype))
        if not torch.is_inference_mode_enabled() and _no_version_counter(d):
            return stock("may_raise", _inference_text(i))
        dshape = d.shape
        if dshape != s.shape:
            try:
                ok = torch.broadcast_shapes(s.shape, dshape) == dshape
            except RuntimeError:
                ok = False
            if not ok:
                return stock(
                    "may_raise",
                    f"src[{i}] shape {tuple(s.shape)} does not broadcast to dst[{i}] shape "
                    f"{tuple(dshape)}: stock raises there, after writing the pairs before it",
                )
            reason = ("broadcast", f"src[{i}] shape {tuple(s.shape)} broadcasts to dst[{i}] shape {tuple(dshape)}")
        else:
            reason = None
        if d.dim() == 0 and d.dtype != s.dtype and dd.type == "cpu":
            return stock("order_dependent", _zero_dim_cast_text(i, s.dtype, d.dtype))
        if d.numel() == 0:
            if _empty_write_refused(d):
                return stock("may_raise", _empty_write_text(i))
            plan.empty.append(i)
            continue
        ddense = d.is_contiguous() or _dense(d)
        if not ddense and torch._debug_has_internal_overlap(d) == 1:
            return stock("may_raise", f"dst[{i}] has internal overlap: stock raises there")
        intervals.append((str(dd), _ptr(d), _ptr(d) + _span_bytes(d), i, True))
        if s.numel():
            intervals.append((str(sd), _ptr(s), _ptr(s) + _span_bytes(s), i, False))
        if reason is None:
            reason = _off_route(i, d, s, dd, sd, ddense, caps, lookup)
        if reason is None:
            fast.append(i)
        else:
            plan.fallback.append(i)
            plan.reasons[i] = reason

    hit = _first_overlap(intervals)
    if hit is not None:
        a, a_dst, b, b_dst = hit
        return stock(
            "aliasing",
            f"{_name(b, b_dst)} overlaps {_name(a, a_dst)}: kept as stock's sequential copy_ loop",
        )
    _coalesce_and_group(plan, fast, dsts, srcs, caps)
    plan.fallback_launches = len(plan.fallback)
    return plan


def _plain(t) -> bool:
    return (isinstance(t, _Tensor) and not _own_dispatch(t) and not t.is_nested and t.layout is _strided
            and t.device.type != "meta")


def whole_list_call(dsts, srcs) -> bool:
    """Whether stock's op takes this call whole (a ``whole_list_only`` device): its result is then
    stock's by construction, and ``verify`` has nothing to compare (its per-destination clones
    would lose any overlap between destinations, which stock's batched kernel keeps)."""
    return _whole_list_capability(dsts, srcs, capabilities.lookup) is not None


def _whole_list_capability(dsts, srcs, lookup) -> capabilities.Capability | None:
    """The capability of a ``whole_list_only`` device type the call touches, if every tensor is a
    plain strided one (others take the usual whole-call decisions below)."""
    found = None
    looked: set[str] = set()  # one lookup per device type, not per tensor
    for t in (*dsts, *srcs):
        if not _plain(t):
            return None
        if found is None and t.device.type not in looked:
            looked.add(t.device.type)
            cap = lookup(t.device.type)
            if cap is not None and cap.whole_list_only:
                found = cap
    return found


def stock_batches(dsts, srcs) -> bool:
    """Whether stock ``_foreach_copy_`` on CUDA takes its batched route (multi_tensor_apply) for
    these lists, as ATen ``foreach_tensor_copy_list_kernel_cuda_`` decides: every tensor on one
    device, strided, non-overlapping and dense; one source dtype; one destination dtype (newer
    ATen asks for it; older ones do not, and are then counted on the safe side); per pair equal
    sizes, and equal strides except on size-1 dims (ATen ``_check_tensors_share_sizes_and_strides``)."""
    dev, sdt, ddt = dsts[0].device, srcs[0].dtype, dsts[0].dtype
    for d, s in zip(dsts, srcs):
        if d.device != dev or s.device != dev or d.dtype != ddt or s.dtype != sdt:
            return False
        if d.shape != s.shape or not _same_strides(d, s):
            return False
        if not (_dense(d) and _dense(s)):
            return False
    return True


def _whole_list_plan(plan: Plan, dsts, srcs, cap: capabilities.Capability) -> Plan:
    """A call on a ``whole_list_only`` device: stock takes it whole, always. Where stock batches
    it, the plan is one foreach group of every pair, empty ones included (the executor hands the
    group to stock's op: the same route, bits, bumps and errors); else the whole call is stock's
    per-pair route, which is a ``copy_`` loop (the executor runs that loop, bumping as it goes,
    so an error leaves the same pairs written and bumped)."""
    if not stock_batches(dsts, srcs):
        plan.stock_reason = ("whole_list_route", _whole_list_text(cap.name))
        return plan
    plan.groups.append(Group(list(range(len(dsts))), dsts[0].device, srcs[0].dtype, dsts[0].dtype,
                             cap.launches(len(dsts))))
    return plan


def _whole_list_text(name: str) -> str:
    return (
        f"{name}: stock's batched kernel takes only whole lists of one device, one source dtype, one "
        "destination dtype and equal sizes and strides pair by pair; stock copies this list pair by pair"
    )


def _off_route(i, d, s, dd, sd, ddense, caps, lookup) -> tuple[str, str] | None:
    """Why pair ``i`` (equal shapes, non-empty) is off the fast route, or None if it is on it."""
    if dd != sd:
        return ("device", f"src[{i}] on {sd}, dst[{i}] on {dd}")
    if not ddense:
        return ("not_dense", f"dst[{i}] is not dense")
    if not (s.is_contiguous() or _dense(s)):
        return ("not_dense", f"src[{i}] is not dense")
    if not _same_strides(d, s):
        return ("strides", f"src[{i}] strides {s.stride()} differ from dst[{i}] strides {d.stride()}")
    if d.is_conj() or s.is_conj() or d.is_neg() or s.is_neg():
        return ("conj_neg", f"pair {i} has a lazy conjugate or negative bit")
    sdt, ddt = s.dtype, d.dtype
    if sdt.is_complex and not ddt.is_complex:
        return ("dtype", f"pair {i} casts complex to real (stock warns per copy)")
    cap = caps.get(dd.type, caps)
    if cap is caps:
        cap = caps[dd.type] = lookup(dd.type)
    if cap is None:
        return ("no_capability", f"no fast path for device type {dd.type}")
    return None


def _coalesce_and_group(plan: Plan, fast: list[int], dsts, srcs, caps) -> None:
    """Split fast-route pairs into coalesced runs and per-dtype foreach groups."""
    singles: list[int] = []
    run: list[int] = []
    d_end = s_end = -1

    def close() -> None:
        if len(run) > 1:
            d0, s0 = dsts[run[0]], srcs[run[0]]
            nbytes_d = d_end - _ptr(d0)
            nbytes_s = s_end - _ptr(s0)
            if _in_one_storage(d0, nbytes_d) and _in_one_storage(s0, nbytes_s):
                plan.runs.append(
                    Run(list(run), nbytes_d // d0.element_size(), d0.device, s0.dtype, d0.dtype)
                )
                return
        singles.extend(run)

    for i in fast:
        d, s = dsts[i], srcs[i]
        if run:
            p = run[-1]
            pd, ps = dsts[p], srcs[p]
            if (
                _ptr(d) == d_end
                and _ptr(s) == s_end
                and d.dtype == pd.dtype
                and s.dtype == ps.dtype
                and d.device == pd.device
                and d.is_contiguous()
                and s.is_contiguous()
            ):
                run.append(i)
                d_end += d.numel() * d.element_size()
                s_end += s.numel() * s.element_size()
                continue
            close()
            run = []
        if d.is_contiguous() and s.is_contiguous():
            run = [i]
            d_end = _ptr(d) + d.numel() * d.element_size()
            s_end = _ptr(s) + s.numel() * s.element_size()
        else:
            singles.append(i)
    close()

    by_key: dict[tuple, list[int]] = {}
    for i in sorted(singles):
        d, s = dsts[i], srcs[i]
        by_key.setdefault((d.device, s.dtype, d.dtype), []).append(i)
    for (dev, sdt, ddt), idx in by_key.items():
        cap = caps[dev.type]
        if cap.supports(sdt, ddt):
            plan.groups.append(Group(idx, dev, sdt, ddt, cap.launches(len(idx))))
            continue
        for i in idx:
            plan.fallback.append(i)
            plan.reasons[i] = (
                "dtype",
                f"dtype pair {_dt(sdt)}->{_dt(ddt)} not supported by the {cap.name} fast path",
            )
    plan.fallback.sort()
