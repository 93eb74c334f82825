"""Per-device capability table: which copies a device's native batched kernel can take.

The table is data, not branches: the C++ planner reads the snapshot of it pushed on every change
(``_native.push_capabilities``; csrc/planner/capability_table.h), and tests replace entries with
``override({...})`` to drive the npu rules on a CPU machine.

Sources mirrored:
- npu: Ascend op-plugin ``op_plugin/ops/opapi/ForeachCopyKernelOpApi.cpp`` (``aclnnForeachCopy``,
  48 tensors a launch; int64/float64/bool from CANN 8.1.RC1; the cross-dtype pairs
  fp32<->fp16 and fp32<->bf16 from CANN 9.1).
- cuda: ATen ``ForeachBinaryOpList.cu`` ``_foreach_copy_`` (``multi_tensor_apply``, 110 tensor
  pairs a launch for depth-2 lists; src and dst dtypes may differ). Exact only on the whole lists
  stock itself sends there: its copy functor goes through the op math type (fp16/bf16 through
  fp32, which quiets a signalling NaN that per-pair ``copy_`` keeps), so a sub-list of a list stock
  copies pair by pair would change bits (seen on an H200; ``whole_list_only``).
- cpu: ATen runs ``_foreach_copy_`` as a per-tensor loop of ``copy_``. This entry is the one
  without the native library (one launch per tensor). Loading it replaces the entry with the C++
  kernel's (csrc/cpu/; ``_native.load``): a host pass, one launch per group, taking the pairs the
  kernel copies as stock does (same-dtype pairs as bytes, fp32<->bf16/fp16 with ATen's own
  vectorized routines where the load's self-check found them bit for bit stock's); every other
  pair is a fallback pair, stock's ``copy_``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
from typing import Callable, Iterator, Mapping

import torch

__all__ = ["Capability", "lookup", "table", "override", "npu_capability", "cann_version", "on_change"]

_f32, _f16, _bf16 = torch.float32, torch.float16, torch.bfloat16


@dataclasses.dataclass(frozen=True)
class Capability:
    """What one device type's native batched copy kernel accepts.

    Attributes:
        name: device type the rules come from, used in fallback reasons ("npu", "cuda", "cpu").
        dtypes: source dtypes the kernel takes for same-dtype copies; ``None``: every dtype the
            rule lets leave stock (those ``copy_`` never raises on: csrc/planner/classify_impl.h
            ``copy_dtype``).
        cross_pairs: ``(src_dtype, dst_dtype)`` pairs the kernel converts natively; ``None``:
            every pair of those dtypes. A complex -> real pair stays off the fast path whatever the
            table lists (the rule, csrc/planner/classify.h: stock warns per copy there).
        max_tensors_per_launch: tensor pairs one launch can carry; ``None`` means one launch per
            tensor (a host loop, as on CPU).
        source: where the rules come from, shown by ``doctor``.
        whole_list_only: the kernel gives stock's bits only where stock's own op would use it,
            on a whole list: any call touching this device type goes to stock's op whole, counted
            as the fast path when stock's op takes its batched kernel (csrc/planner/plan.cpp).
        stage_bytes: the most scratch memory (bytes) one *stage* may allocate: a cross-dtype group
            the kernel cannot convert is copied through scratch (docs/design.md, "Staged casts"),
            in chunks whose scratch (the sources' bytes, plus the destinations' where they are not
            one adjacent run) stays within this; ``0`` never stages. Change it with ``override({"npu": dataclasses.replace(cap,
            stage_bytes=n)})``.
        host_pass: the kernel is a host pass that also copies the call's coalesced runs (the
            library's CPU kernel): there a run costs no launch of its own, so runs are always kept
            (on a device, a run that saves no launch joins its foreach group: csrc/planner/runs.h).
        batched_transfers: the device's ``_foreach_copy_`` copies a uniform host->device or
            device->host list in one batched memcpy (op-plugin ``memcpyBatch``).
        batched_keeps_versions: the device's batched kernels move no version counter (op-plugin
            calls no ``increment_version`` there) while its per-tensor copies move each one: the
            library then leaves exactly the counters stock leaves, per source-dtype group as
            op-plugin groups it (csrc/planner/plan.cpp, stock_keeps_version).
    """

    name: str
    dtypes: frozenset | None
    cross_pairs: frozenset | None
    max_tensors_per_launch: int | None
    source: str = ""
    whole_list_only: bool = False
    stage_bytes: int = 0
    host_pass: bool = False
    batched_transfers: bool = False
    batched_keeps_versions: bool = False


def _parse_cann(version: str | None) -> tuple[int, int, int]:
    """'8.1.RC1' -> (8, 1, 1); '9.1.0' -> (9, 1, 1000): a release candidate sorts below its release,
    alpha/beta builds below every RC; ``None`` (unknown) below everything."""
    if not version:
        return (0, 0, 0)
    nums = [int(x) for x in re.findall(r"\d+", version)[:2]] + [0, 0]
    rc = re.search(r"RC(\d+)", version.upper())
    if rc:
        stage = int(rc.group(1))
    elif re.search(r"ALPHA|BETA", version.upper()):
        stage = 0
    else:
        stage = 1000
    return (nums[0], nums[1], stage)


# Scratch a staged cast may hold at once on npu (docs/design.md, "Staged casts"): one chunk holds the
# fp32 shards of a Llama-3-8B block at world size 8 (27M elements, 109 MB), a quarter of that
# all-gather's own bf16 output.
NPU_STAGE_BYTES = 128 << 20


def npu_capability(cann: str | None) -> Capability:
    """The op-plugin ``aclnnForeachCopy`` rules for a CANN version string (``None``: unknown).

    An unknown version gets the conservative base set (no int64/fp64/bool, no cross-dtype).
    """
    ver = _parse_cann(cann)
    dtypes = {torch.int32, torch.int16, torch.int8, torch.uint8, _bf16, _f32, _f16}
    if ver >= (8, 1, 1):  # from 8.1.RC1
        dtypes |= {torch.int64, torch.float64, torch.bool}
    cross = set()
    if ver >= (9, 1, 1000):  # from the 9.1 release
        cross = {(_f32, _f16), (_f32, _bf16), (_f16, _f32), (_bf16, _f32)}
    return Capability(
        name="npu",
        dtypes=frozenset(dtypes),
        cross_pairs=frozenset(cross),
        max_tensors_per_launch=48,
        source=f"op-plugin aclnnForeachCopy, CANN {cann or 'unknown'}",
        stage_bytes=NPU_STAGE_BYTES,
        batched_transfers=True,
        batched_keeps_versions=True,
    )


def cann_version() -> str | None:
    """CANN version reported by torch_npu, or the one the emulated device models
    (:mod:`npu_dispatch.testing.emulated_npu`, once installed), else None.

    Never imports torch_npu itself: importing it without CANN breaks ``import torch``.
    """
    import sys

    mod = sys.modules.get("torch_npu")
    if mod is None:
        # The emulated Ascend device (npu_dispatch.testing.emulated_npu), once installed.
        emu = sys.modules.get("npu_dispatch.testing.emulated_npu")
        return emu.cann_version() if emu is not None else None
    try:  # the documented API (torch_npu.npu.utils)
        return str(mod.npu.utils.get_cann_version())
    except Exception:  # older torch_npu: no such function, or CANN not reachable
        pass
    for path in ("version.cann", "version.__cann_version__", "__cann_version__"):
        obj = mod
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return str(obj)
    return None


def _defaults() -> dict[str, Capability]:
    return {
        "cpu": Capability("cpu", None, None, None, "ATen copy_ loop"),
        "cuda": Capability("cuda", None, None, 110, "ATen multi_tensor_apply",
                           whole_list_only=True),
    }


# Reentrant: listeners run under it (they read table()), so a change and its push to C++ are one
# step and two threads' pushes cannot land out of order.
_lock = threading.RLock()
_table: dict[str, Capability] = _defaults()
_overrides: list[Mapping[str, Capability | None]] = []
# Called after every override enter/exit: the native planner keeps a pushed copy of the table.
_listeners: list[Callable[[], None]] = []


def on_change(fn: Callable[[], None]) -> None:
    """Call ``fn()`` whenever the table in force changes (an ``override`` starts or ends)."""
    if fn not in _listeners:
        _listeners.append(fn)


def _changed() -> None:
    for fn in list(_listeners):
        fn()


def _device_type(device) -> str:
    """``"cuda"`` for ``"cuda"``, ``"cuda:0"`` and ``torch.device("cuda", 0)``."""
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        # Parsed here, not by torch.device: "npu" is a device type only once torch_npu is loaded.
        kind, sep, index = device.partition(":")
        if not kind or (sep and not index.isdigit()):
            raise ValueError(f"invalid device string {device!r}: expected 'type' or 'type:index'")
        return kind
    raise TypeError(f"expected a device type, a device string or a torch.device, not {type(device).__name__}")


def lookup(device_type: str | torch.device) -> Capability | None:
    """The capability in force for a device type (``"npu"``), a device (``"npu:0"``,
    ``torch.device("npu", 0)``); ``None`` means no fast path on that device.

    Raises:
        TypeError: neither a string nor a ``torch.device``.
        ValueError: a string that is not ``type`` or ``type:index`` (``"cuda:x"``).
    """
    device_type = _device_type(device_type)
    for layer in reversed(_overrides):
        if device_type in layer:
            return layer[device_type]
    cap = _table.get(device_type)
    if cap is None and device_type == "npu":
        # Built on first sight of an npu tensor, when torch_npu is already loaded by the user.
        with _lock:
            cap = _table.setdefault("npu", npu_capability(cann_version()))
    return cap


def lookup_default(device_type: str | torch.device) -> Capability | None:
    """The default entry for a device type or device (as :func:`lookup`), ignoring overrides."""
    return _table.get(_device_type(device_type))


def set_default(device_type: str, cap: Capability) -> None:
    """Replace a default entry (the native library does, for the CPU kernel it brings)."""
    with _lock:
        _table[device_type] = cap
        _changed()


def table() -> dict[str, Capability | None]:
    """The table in force now (defaults, then overrides), for reports."""
    merged: dict[str, Capability | None] = dict(_table)
    merged.setdefault("npu", npu_capability(cann_version()))
    for layer in _overrides:
        merged.update(layer)
    return merged


@contextlib.contextmanager
def override(entries: Mapping[str, Capability | None]) -> Iterator[None]:
    """Replace table entries inside a ``with`` block (``None`` disables a device's fast path).

    Example: ``with override({"cpu": npu_capability("8.0.RC3")}):`` makes CPU tensors follow the
    npu rules of CANN 8.0, so the npu planner decisions can be tested without an NPU.

    The table is process-wide: while the block runs, every thread plans with the override.
    """
    layer = dict(entries)
    with _lock:
        _overrides.append(layer)
        _changed()
    try:
        yield
    finally:
        with _lock:
            _overrides.remove(layer)
            _changed()
