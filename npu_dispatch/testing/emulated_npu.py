"""An emulated Ascend NPU: PrivateUse1 renamed ``npu``, host memory, and a model of op-plugin's
``_foreach_copy_`` that counts device launches.

It runs the npu code paths of PyTorch, FSDP2 and npu_dispatch where no NPU exists: the dispatch
keys, the planner's npu groups, FSDP2's device handling (streams, events, storage resize) and a
process group (``init_process_group("cpu:gloo,npu:emulated_hccl")``, collectives on gloo).
What it shows: launch counts and results. What it cannot: device time, a missing stream wait
(every kernel runs synchronously), Ascend numerics, op-plugin's coverage of other ops.

The kernels (``csrc/emulated_npu/``) follow PyTorch's OpenReg test backend; the ``_foreach_copy_``
model cites the op-plugin version it follows (``csrc/emulated_npu/foreach_copy.cpp``). Built with
``torch.utils.cpp_extension`` at install (``pip install --no-build-isolation``), else at first use
(then cached), by the package's one loader (``npu_dispatch._loader``).

Example::

    from npu_dispatch.testing import emulated_npu
    emulated_npu.install(cann="8.0.RC3")
    x = torch.ones(4, device="npu")
    emulated_npu.reset_launches()
    torch._foreach_copy_([torch.empty(4, device="npu")], [x])
    emulated_npu.launches()   # {'aclnnForeachCopy': 1}
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import types
from datetime import timedelta
from typing import Iterator

import torch

from .. import _build, _loader

__all__ = ["install", "installed", "cann_version", "launches", "reset_launches", "launches_by_op", "LaunchesByOp",
           "available", "BACKEND", "DEFAULT_CANN"]

DEFAULT_CANN = "8.0.RC3"
BACKEND = "emulated_hccl"  # the process-group backend name for npu tensors

_lock = threading.Lock()
_ext = None
_cann: str | None = None
_build_error: str | None = None
_NPU_TYPE = 20  # c10::DeviceType::PrivateUse1


def available() -> tuple[bool, str]:
    """Whether the emulated device can be installed here, and if not, why (no compiler, no
    sources, a real torch_npu loaded, PrivateUse1 taken)."""
    if "torch_npu" in sys.modules:
        return False, "the real torch_npu is loaded: the emulated npu would replace its device"
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", "npu"):
        return False, f"PrivateUse1 is already registered as {name!r}"
    if _ext is not None:
        return True, ""
    if _build_error is not None:
        return False, _build_error
    src = _loader.source_dir()
    if src is None or not _build.EMULATED_NPU.sources(src):
        return False, "the emulated device's C++ sources (csrc/emulated_npu) are not installed"
    if shutil.which(os.environ.get("CXX", "c++")) is None and _loader.installed_matches(_build.EMULATED_NPU):
        return False, "no C++ compiler: the emulated device builds with torch.utils.cpp_extension"
    return True, ""



def _load():
    """The installed build, else a build at first use (npu_dispatch._loader, then cached)."""
    global _ext, _build_error
    if _ext is None:
        try:
            _ext = _loader.load(_build.EMULATED_NPU)[0]
        except _loader.LoadError as e:  # kept for available()'s reason, then raised
            _build_error = f"the emulated device did not build: {e}"
            raise RuntimeError(f"npu_dispatch.testing.emulated_npu: {_build_error}") from e
    return _ext


def installed() -> bool:
    """Whether :func:`install` has run in this process."""
    return _cann is not None


def cann_version() -> str | None:
    """The CANN version the emulated device models (``"8.0.RC3"``), or None before :func:`install`.
    :func:`npu_dispatch.capabilities.cann_version` reads it as it reads torch_npu's."""
    return _cann


def install(cann: str = DEFAULT_CANN) -> None:
    """Register the emulated npu device in this process (idempotent).

    Args:
        cann: the CANN version whose op-plugin rules the ``_foreach_copy_`` model follows
            ("8.0.RC3", "8.1.RC1", "9.1.0"...). Calling again with another version switches the
            model and npu_dispatch's capability table to it.

    Raises:
        RuntimeError: the real ``torch_npu`` is loaded, PrivateUse1 is taken by another backend,
            or the device cannot be built here (no compiler): the message says which.
    """
    global _cann
    from .. import capabilities

    with _lock:
        ok, why = available()
        if not ok:
            raise RuntimeError(f"npu_dispatch.testing.emulated_npu: {why}")
        ext = _load()
        major, minor, stage = capabilities._parse_cann(cann)
        ext.set_cann(major, minor, stage)
        if _cann is None:
            ext.register_device()
            if torch._C._get_privateuse1_backend_name() != "npu":
                torch.utils.rename_privateuse1_backend("npu")
            torch._register_device_module("npu", _device_module(ext))
            torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                                 for_storage=True)
            _register_backend(ext)
        _cann = cann
    # Outside the lock: the capability push may load npu_dispatch's own extension.
    capabilities.set_default("npu", capabilities.npu_capability(cann))


def launches() -> dict[str, int]:
    """Device launches since the last :func:`reset_launches`, by kind: ``aclnnForeachCopy``,
    ``memcpyBatch``, ``copy`` (one per ``copy_`` that reaches the device) and, for every other op
    the device ran, its ATen name (``aten::add``). All threads count."""
    return dict(_require().launches())


def reset_launches() -> None:
    """Zero the launch counts."""
    _require().reset_launches()


class LaunchesByOp(dict):
    """``{op label: {launch kind: count}}``, and ``calls``: ``{op label: calls}``."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}


@contextlib.contextmanager
def launches_by_op() -> Iterator[LaunchesByOp]:
    """Attribute device launches to the copy op that issued them, inside the block.

    Yields a :class:`LaunchesByOp` filled as the block runs: ``{"cast": {...}, "copy_in": {...},
    ...}``, each a :func:`launches`-style dict, and ``.calls`` per label: the ``copy`` column of
    the op table (csrc/dispatch/owned_ops.h): ``cast`` for a top-level ``aten._foreach_copy_``
    (FSDP2's mixed-precision cast) or its functional variant; launches of a nested op count in
    its caller. It is a TorchDispatchMode (every op of the block crosses into Python):
    an accounting tool, not for timing.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    from .. import _op_table

    # Each intercepted op's copy, as the op table names it (csrc/dispatch/owned_ops.h).
    labels = {row.counted + ("" if row.overload else ".default"): row.copy
              for row in _op_table.rows() if row.intercepted}
    result = LaunchesByOp()
    ext = _require()
    lock = threading.Lock()

    class _Accountant(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            label = labels.get(str(func))
            if label is None:
                return func(*args, **(kwargs or {}))
            with lock:  # one window at a time: another thread's launches would mix in
                before = ext.launches()
                out = func(*args, **(kwargs or {}))
                after = ext.launches()
                slot = result.setdefault(label, {})
                result.calls[label] = result.calls.get(label, 0) + 1
                for k, v in after.items():
                    if v != before.get(k, 0):
                        slot[k] = slot.get(k, 0) + v - before.get(k, 0)
            return out

    with _Accountant():
        yield result


def _require():
    if _ext is None or _cann is None:
        raise RuntimeError("npu_dispatch.testing.emulated_npu: call install() first")
    return _ext


def _register_backend(ext) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return

    def create(store, rank, size, timeout):
        prefix = dist.PrefixStore(f"{BACKEND}/", store)
        gloo = dist.ProcessGroupGloo(prefix, rank, size, timeout if isinstance(timeout, timedelta)
                                     else timedelta(seconds=1800))
        return ext.make_hccl(gloo, rank, size)

    if BACKEND.upper() not in dist.Backend.__dict__:
        dist.Backend.register_backend(BACKEND, create, devices=["npu"])


def _device_module(ext) -> types.ModuleType:
    """``torch.npu``: what FSDP2, DeviceMesh and torch.accelerator ask of a device module, with
    synchronous stand-ins for streams and events (events are plain ``torch.Event``: subclasses are
    refused by ``elapsed_time``)."""
    mod = types.ModuleType("torch.npu")
    mod.__doc__ = "The emulated Ascend device module (npu_dispatch.testing.emulated_npu)."

    class Stream(torch.Stream):
        def __new__(cls, device=None, priority=0, **kwargs):
            if device is None:
                device = torch.device("npu", ext.current_device())
            return super().__new__(cls, device=device, priority=priority, **kwargs)

    def _index(device) -> int:
        if device is None:
            return ext.current_device()
        if isinstance(device, int):
            return device
        d = torch.device(device)
        return ext.current_device() if d.index is None else d.index

    def Event(enable_timing=False, blocking=False, interprocess=False):  # noqa: N802  torch.cuda's name
        return torch.Event(torch.device("npu", ext.current_device()), enable_timing=enable_timing,
                           blocking=blocking, interprocess=interprocess)

    def current_stream(device=None):
        return torch.accelerator.current_stream(torch.device("npu", _index(device)))

    def default_stream(device=None):
        return torch.Stream(stream_id=0, device_index=_index(device), device_type=_NPU_TYPE)

    def stream(s):
        return contextlib.nullcontext() if s is None else s

    @contextlib.contextmanager
    def device(d):
        prev = ext.current_device()
        ext.set_device(_index(d))
        try:
            yield
        finally:
            ext.set_device(prev)

    mod.Stream = Stream
    mod.Event = Event
    mod.current_stream = current_stream
    mod.default_stream = default_stream
    mod.stream = stream
    mod.device = device
    mod.is_available = lambda: True
    mod.is_initialized = lambda: True
    mod._lazy_init = lambda: None
    mod._is_in_bad_fork = lambda: False
    mod.device_count = ext.device_count
    mod.current_device = ext.current_device
    mod.set_device = lambda d: ext.set_device(_index(d))
    mod.synchronize = lambda device=None: None
    mod.manual_seed = lambda seed: None
    mod.manual_seed_all = lambda seed: None
    mod.seed = lambda: None
    mod.seed_all = lambda: None
    mod.initial_seed = lambda: torch.initial_seed()
    mod.get_rng_state = lambda device=None: torch.get_rng_state()
    mod.set_rng_state = lambda state, device=None: None
    mod.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16, torch.float32]
    mod.is_bf16_supported = lambda: True
    return mod
