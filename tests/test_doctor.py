"""``python -m npu_dispatch doctor`` reports what it promises, without importing torch_npu."""
import os
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
    if os.environ.get("NPU_DISPATCH_NATIVE", "1") == "0":
        assert "native extension   not built: " in out and "NPU_DISPATCH_NATIVE=0" in out
        assert "NpuFastCopyMode    none: without the native library" in out
    else:
        assert "native extension   built: loaded npu_dispatch" in out  # the install's build or a first-use one
        assert "NpuFastCopyMode    C++ kernels at BackendSelect" in out


def test_doctor_probes_a_broken_torch_npu_without_importing_it(tmp_path):
    # A torch_npu that fails like one without CANN: doctor must report it, from a child process.
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('libhccl.so: cannot open shared object file')\n")
    code = "import sys, npu_dispatch.doctor as d; print(d.report()); print('imported:', 'torch_npu' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "installed but not importable: ImportError: libhccl.so" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "imported: False"
