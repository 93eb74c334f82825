"""``python -m npu_dispatch doctor`` reports what it promises, without importing torch_npu."""
import subprocess
import sys

import torch


def test_doctor_prints_versions_devices_and_capability_table():
    proc = subprocess.run([sys.executable, "-m", "npu_dispatch", "doctor"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"torch              {torch.__version__}" in out
    assert "device types seen  cpu" in out
    for row in ("torch_npu", "CANN", "triton", "native extension"):
        assert any(line.startswith(row) for line in out.splitlines()), row
    assert "  npu   launch: 48 tensors" in out and "  cpu   launch:" in out
    assert "torch_npu" not in sys.modules
