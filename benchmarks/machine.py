"""What the numbers were measured on: CPU, threads, torch, and whether the native extension loaded."""
from __future__ import annotations

import datetime
import importlib
import os
import platform

import torch

__all__ = ["native_status", "machine_info"]

_FLAG_NAMES = ("available", "is_available", "loaded", "is_loaded", "AVAILABLE", "LOADED", "ENABLED")
_ERROR_NAMES = ("load_error", "LOAD_ERROR", "error", "ERROR", "reason", "why_unavailable")


def native_status() -> dict:
    """Whether ``npu_dispatch._native`` (the C++ planner and CPU kernel) is present and loaded.

    Returns ``{"present": bool, "loaded": bool | None, "detail": str}``; ``loaded`` is None when
    the module exists but exposes none of the usual flags (``available()``, ``LOADED``...).
    """
    try:
        mod = importlib.import_module("npu_dispatch._native")
    except ModuleNotFoundError as e:
        if e.name == "npu_dispatch._native":
            return {"present": False, "loaded": False, "detail": "no npu_dispatch._native: pure-Python engine"}
        return {"present": True, "loaded": False, "detail": f"import failed: {e}"}
    except Exception as e:  # a broken build must not stop the benchmark
        return {"present": True, "loaded": False, "detail": f"import failed: {type(e).__name__}: {e}"}
    loaded = None
    for name in _FLAG_NAMES:
        flag = getattr(mod, name, None)
        try:
            flag = flag() if callable(flag) else flag
        except Exception as e:
            return {"present": True, "loaded": False, "detail": f"{name}() raised {type(e).__name__}: {e}"}
        if isinstance(flag, bool):
            loaded = flag
            break
    error = next((getattr(mod, n) for n in _ERROR_NAMES if getattr(mod, n, None)), None)
    if loaded is None:
        detail = f"module present, no load flag found ({', '.join(_FLAG_NAMES)})"
    else:
        detail = "loaded" if loaded else "not loaded"
    if error is not None and not loaded:
        detail += f": {error}"
    return {"present": True, "loaded": loaded, "detail": detail}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(threads: int) -> dict:
    """Machine and software facts for the report (``threads``: torch intra-op threads used)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    cpus = os.cpu_count() or 1
    return {
        # Load from other processes: parallel copies then wait on descheduled worker threads.
        "busy": load is not None and load[0] > 0.5 * cpus,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "logical_cpus": cpus,
        "torch_threads": threads,
        "load_average": load,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "native_extension": native_status(),
    }
