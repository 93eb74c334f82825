"""The semantic tests again, on NpuFastCopyMode's Python dispatch-mode path.

That path runs where the C++ interception cannot (a dispatcher fact fails: ``python -m npu_dispatch
doctor``) and under ``strict`` / ``verify``; ``NPU_DISPATCH_INTERCEPTION=0`` forces it. Results,
errors and version counters must be stock's there too, so the same tests run in a child pytest
with that variable set (tests of the interception's own mechanics skip: cases.interception_only).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cases import PYTHON_PATH

SEMANTIC = ["test_version_counter.py", "test_interception.py", "test_mode.py", "test_fsdp_copies.py",
            "test_one_pass.py", "test_whole_list.py", "test_fuzz.py"]


@pytest.mark.skipif(PYTHON_PATH, reason="already the Python path's run")
def test_the_semantic_tests_pass_on_the_python_dispatch_mode_path():
    from npu_dispatch import _native

    if not _native.available():
        pytest.skip(f"no native library, so no Python dispatch-mode path: {_native.status()[1]}")
    here = os.path.dirname(os.path.abspath(__file__))
    # The fuzzer's 10,000 calls per copy run in the main run; a fifth of them here.
    env = dict(os.environ, NPU_DISPATCH_INTERCEPTION="0",
               NPU_DISPATCH_FUZZ_CALLS=os.environ.get("NPU_DISPATCH_FUZZ_CALLS", "2000"))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SEMANTIC],
                         cwd=here, env=env, capture_output=True, text=True, timeout=900)
    tail = out.stdout[-4000:]
    assert out.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail
