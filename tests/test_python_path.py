"""The semantic tests again, on NpuFastCopyMode's Python dispatch-mode path.

That path runs where the C++ interception cannot (a dispatcher fact fails: ``python -m npu_dispatch
doctor``) and under ``strict`` / ``verify``; ``NPU_DISPATCH_INTERCEPTION=0`` forces it. Results,
errors and version counters must be stock's there too, so the same tests run in child pytests
with that variable set (tests of the interception's own mechanics skip: cases.interception_only).

The children are two shards of the files, run side by side. They start as soon as collection is
done (conftest.py calls ``start_early``) when this run includes the test, so they run beside the
rest of the suite; the test waits for them and checks both passed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from cases import PYTHON_PATH

# Two shards of about equal time (seconds each file took on this path, 2 cores): side by side they
# take about the longer shard's time instead of the sum.
SHARDS = [["test_fsdp_copies.py", "test_fuzz.py", "test_interception.py", "test_version_counter.py"],  # 11+9+4+2
          ["test_mode.py", "test_one_pass.py", "test_whole_list.py"]]  # 11+8+5
SEMANTIC = ["test_version_counter.py", "test_interception.py", "test_mode.py", "test_fsdp_copies.py",
            "test_one_pass.py", "test_whole_list.py", "test_fuzz.py"]
TIMEOUT_S = 900
NICE = 19


class _Children:
    """The shards' child pytests, started together; their output goes to files (never a full pipe)."""

    def __init__(self):
        here = os.path.dirname(os.path.abspath(__file__))
        # The fuzzer's 5,000 calls per copy run in the main run; 2,000 here.
        env = dict(os.environ, NPU_DISPATCH_INTERCEPTION="0",
                   NPU_DISPATCH_FUZZ_CALLS=os.environ.get("NPU_DISPATCH_FUZZ_CALLS", "2000"))
        self.tmp = tempfile.TemporaryDirectory()
        self.logs = [[open(os.path.join(self.tmp.name, f"shard{k}.{kind}"), "w+") for kind in ("out", "err")]
                     for k in range(len(SHARDS))]
        # At a lower priority: started early, they take the cores the rest of the suite leaves idle.
        self.procs = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *shard],
                                       cwd=here, env=env, stdout=out, stderr=err, text=True,
                                       preexec_fn=lambda: os.nice(NICE))
                      for shard, (out, err) in zip(SHARDS, self.logs)]

    def results(self, timeout: float) -> list[tuple[int, str, str]]:
        """``(returncode, stdout tail, stderr tail)`` per shard, once all have ended."""
        try:
            for proc in self.procs:
                proc.wait(timeout=timeout)
        finally:
            self.stop()
        out = []
        for proc, files in zip(self.procs, self.logs):
            tails = []
            for f, n in zip(files, (4000, 2000)):
                f.seek(0)
                tails.append(f.read()[-n:])
                f.close()
            out.append((proc.returncode, *tails))
        self.tmp.cleanup()
        return out

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def discard(self) -> None:
        self.stop()
        for files in self.logs:
            for f in files:
                f.close()
        self.tmp.cleanup()


_started: list = []  # the children start_early started, not yet waited for


def _native_or_why() -> str | None:
    from npu_dispatch import _native

    return None if _native.available() else f"no native library, so no Python dispatch-mode path: {_native.status()[1]}"


def start_early(names: list[str]) -> None:
    """Called by conftest.py once collection is done, with the names of this module's selected
    tests: the children start now where the test that waits for them is among them."""
    wanted = test_the_semantic_tests_pass_on_the_python_dispatch_mode_path.__name__ in names
    if wanted and not PYTHON_PATH and not _started and _native_or_why() is None:
        _started.append(_Children())


def stop_early() -> None:
    """Called by conftest.py at the end of the session: children never waited for are ended."""
    while _started:
        _started.pop().discard()


def test_the_shards_hold_every_semantic_file_once():
    assert sorted(f for shard in SHARDS for f in shard) == sorted(SEMANTIC)


@pytest.mark.skipif(PYTHON_PATH, reason="already the Python path's run")
def test_the_semantic_tests_pass_on_the_python_dispatch_mode_path():
    why = _native_or_why()
    if why is not None:
        pytest.skip(why)
    children = _started.pop() if _started else _Children()
    for shard, (returncode, tail, err) in zip(SHARDS, children.results(TIMEOUT_S)):
        assert returncode == 0, f"{shard}:\n{tail}\n{err}"
        assert " passed" in tail and " failed" not in tail, f"{shard}:\n{tail}"
