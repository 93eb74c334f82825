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


def test_doctor_lists_the_dispatcher_facts_and_all_hold_here():
    if os.environ.get("NPU_DISPATCH_NATIVE", "1") == "0":
        import pytest

        pytest.skip("no native library: no interception kernels, no facts to check")
    proc = subprocess.run([sys.executable, "-m", "npu_dispatch", "doctor"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    facts = [line.strip() for line in proc.stdout.splitlines() if line.startswith("  holds") or line.startswith("  FAILS")]
    names = [f.split(": ", 1)[0] for f in facts]
    assert "holds  no ADInplaceOrView kernel on aten::_foreach_copy_" in names
    assert "holds  a _foreach_copy_ in a scope reaches the kernel and moves the counter once" in names
    assert any(n == "holds  no CompositeImplicitAutograd kernel on fsdp::all_gather_copy_in" for n in names)
    assert all(f.startswith("holds") for f in facts), facts


_FAILING_FACT = r"""
import torch, npu_dispatch as nd
import torch.distributed.fsdp._fully_shard._fsdp_collectives  # defines fsdp::all_gather_copy_in
from npu_dispatch import _native, mode
lib = torch.library.Library("fsdp", "FRAGMENT")
lib.define("npu_dispatch_test_copy(Tensor x) -> Tensor")
lib.impl("npu_dispatch_test_copy", lambda x: x.clone(), "CompositeImplicitAutograd")
facts = _native.module().static_facts(["fsdp::npu_dispatch_test_copy", "fsdp::all_gather_copy_in"])
bad = [f for f in facts if not f[1]]
assert [f[0] for f in bad] == ["no CompositeImplicitAutograd kernel on fsdp::npu_dispatch_test_copy"], facts
assert "decompose above BackendSelect" in bad[0][2]
print("ok")
"""


def test_a_composite_implicit_kernel_on_an_owned_op_is_a_failing_fact():
    from npu_dispatch import _native

    if not _native.available():
        import pytest

        pytest.skip(f"no native library: {_native.status()[1]}")
    proc = subprocess.run([sys.executable, "-c", _FAILING_FACT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
