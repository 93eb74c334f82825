"""On a machine with an Ascend NPU and torch_npu, the npu semantics suite (tests/test_npu_device.py)
runs against the real device (NPU_DISPATCH_REAL_NPU=1; its launch counts, the emulated device's,
skip there). Elsewhere this skips, saying why."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _usable_npus() -> tuple[int, str]:
    if importlib.util.find_spec("torch_npu") is None:
        return 0, "no Ascend NPU here: torch_npu is not installed (the emulated device runs the suite instead)"
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    probe = subprocess.run([sys.executable, "-c", "import torch, torch_npu; print(torch.npu.device_count())"],
                           capture_output=True, text=True, env=env, timeout=300)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["unknown error"])[-1]
        return 0, f"torch_npu is installed but does not load (no CANN?): {last}"
    count = int(probe.stdout.strip() or 0)
    return count, "torch_npu loads but sees no NPU" if count == 0 else ""


def test_the_npu_semantics_suite_passes_on_a_real_npu():
    count, why = _usable_npus()
    if count == 0:
        pytest.skip(why)
    env = dict(os.environ, NPU_DISPATCH_REAL_NPU="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", os.path.join(HERE, "test_npu_device.py")],
                         capture_output=True, text=True, env=env, timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
