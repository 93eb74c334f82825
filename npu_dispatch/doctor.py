"""``python -m npu_dispatch doctor``: what this machine offers the fast path, and why."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys

import torch

from . import capabilities

__all__ = ["report"]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_npu() -> str:
    """Import torch_npu in a child process: in this one a failed import breaks ``import torch``."""
    if importlib.util.find_spec("torch_npu") is None:
        return "not installed"
    ver = _version("torch_npu") or "?"
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    proc = subprocess.run(
        [sys.executable, "-c", "import torch, torch_npu; print(torch.npu.device_count())"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    if proc.returncode == 0:
        return f"{ver}, importable, {proc.stdout.strip()} npu device(s)"
    last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
    return f"{ver} installed but not importable: {last}"


def _cann() -> str:
    for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH", "ASCEND_OPP_PATH"):
        home = os.environ.get(var)
        if not home:
            continue
        for rel in ("version.cfg", "compiler/version.info", "../version.cfg"):
            path = os.path.join(home, rel)
            if os.path.isfile(path):
                with open(path) as f:
                    for line in f:
                        if "version" in line.lower() and "=" in line:
                            return f"{line.split('=', 1)[1].strip()} ({path})"
        return f"found at {home} (version file not found)"
    return "not found (no ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH)"


def _triton() -> str:
    if importlib.util.find_spec("triton") is None:
        return "not installed"
    flavour = "triton-ascend" if _version("triton-ascend") else "triton"
    return f"{flavour} {_version(flavour) or '?'}"


def _install_build() -> str:
    """What the install-time build of the library (a wheel's prebuilt one included) is for, and
    whether it is the one used here."""
    from . import _build, _loader

    why = _loader.installed_matches(_build.LIBRARY)
    if why is None:
        return f"built for torch {torch.__version__} from the sources beside the package: imported as is"
    return why


def _native() -> str:
    from . import _native
    _native.load()  # the install's build, or a first-use build (then cached)
    built, reason = _native.status()
    return f"{'built' if built else 'not built'}: {reason}"


def _interception() -> str:
    from . import _native
    from .mode import _install, _interception_refused

    if _native.status()[0]:
        _install()  # checks the dispatcher facts (csrc/dispatch/dispatcher_facts.h) and installs
        refused = _interception_refused()
        if refused is not None:
            return f"a Python dispatch mode (every op of the block pays for it): {refused}"
        return "C++ kernels at BackendSelect while entered (no Python dispatch mode; other ops unaffected)"
    return "none: without the native library every owned op runs as stock, counted as no_native"


def _facts() -> list[str]:
    """One line per dispatcher fact the interception kernels rely on, checked in this torch."""
    from .mode import FACTS

    return [f"  {'holds' if holds else 'FAILS'}  {name}: {detail}" for name, holds, detail in FACTS]


def _emulated_npu() -> str:
    from .testing import emulated_npu

    if emulated_npu.installed():
        return f"installed in this process, modelling CANN {emulated_npu.cann_version()}"
    ok, why = emulated_npu.available()
    return ("available: examples/fsdp_train.py --device npu --emulate, or "
            "npu_dispatch.testing.emulated_npu.install()") if ok else f"unavailable: {why}"


def _devices() -> list[str]:
    seen = ["cpu"]
    if torch.cuda.is_available():
        seen.append(f"cuda ({torch.cuda.device_count()} device(s))")
    name = torch._C._get_privateuse1_backend_name()
    mod = getattr(torch, name, None) if name != "privateuse1" else None
    if mod is not None and hasattr(mod, "device_count"):
        seen.append(f"{name} ({mod.device_count()} device(s))")
    return seen


def _fmt_cap(cap) -> str:
    if cap is None:
        return "no fast path"
    dts = "every copy dtype" if cap.dtypes is None else ", ".join(sorted(str(d).removeprefix("torch.") for d in cap.dtypes))
    pairs = "every pair" if cap.cross_pairs is None else len(cap.cross_pairs)
    per = "one per tensor" if cap.max_tensors_per_launch is None else f"{cap.max_tensors_per_launch} tensors"
    return f"launch: {per}; dtypes: {dts}; cross-dtype pairs: {pairs}; from {cap.source}"


def report() -> str:
    """The doctor's text: versions, devices, optional stacks, native build, capability table."""
    rows = [
        ("npu_dispatch", _version("npu-dispatch") or "source tree"),
        ("torch", torch.__version__),
        ("device types seen", ", ".join(_devices())),
        ("torch_npu", _torch_npu()),
        ("CANN", _cann()),
        ("emulated npu", _emulated_npu()),
        ("triton", _triton()),
        ("installed build", _install_build()),
        ("native extension", _native()),
        ("NpuFastCopyMode", _interception()),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    facts = _facts()
    if facts:
        lines.append("dispatcher facts the interception relies on (checked at load):")
        lines.extend(facts)
    lines.append("capability table:")
    for dev, cap in sorted(capabilities.table().items()):
        lines.append(f"  {dev:<5} {_fmt_cap(cap)}")
    return "\n".join(lines)
