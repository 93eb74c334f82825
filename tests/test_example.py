"""The main job: FSDP2 training (2 gloo ranks) stock and under the mode, compared bitwise."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from cases import RS_COPY_IN, run_side_by_side

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "fsdp_train.py")


# The two training runs the tests read, started together by the first test that needs one: each
# is a parent and two gloo ranks that leave cores idle at times, so side by side they take less
# than one after the other.
_RUNS = {"json": ["--steps", "3", "--world-size", "2", "--json"], "verdict": ["--steps", "3", "--world-size", "2"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{name: CompletedProcess}`` for each command line of _RUNS."""
    commands = {name: [sys.executable, EXAMPLE, *args] for name, args in _RUNS.items()}
    return run_side_by_side(commands, tmp_path_factory.mktemp("example"), timeout=600)


def test_fsdp2_training_is_bitwise_equal_after_every_step_and_takes_the_fast_path(runs):
    proc = runs["json"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["steps"] == 3 and result["world_size"] == 2
    assert len(result["losses_stock"]) == 3
    assert result["losses_stock"] == result["losses_fast"] and result["bitwise_equal"] is True
    assert result["grads_equal_every_step"] is True and result["params_equal_every_step"] is True
    by_op = result["fast_path_calls_by_op"]
    # All four copies of each all-gather group take the fast path.
    assert by_op["aten._foreach_copy_"] > 0 and by_op["fsdp.all_gather_copy_in"] > 0
    assert by_op["fsdp.split_with_sizes_copy"] == result["calls_by_op"]["fsdp.split_with_sizes_copy"] > 0
    assert by_op[RS_COPY_IN] == result["calls_by_op"][RS_COPY_IN] > 0
    assert result["fallback_calls"] == 0
    # FSDP's copy-in of adjacent bf16 splits is one flat copy per all-gather.
    assert result["paths"]["coalesced"]["calls"] == by_op["fsdp.all_gather_copy_in"]
    assert result["step_seconds_stock"] > 0 and result["step_seconds_fast"] > 0
    assert abs(result["step_speedup"] - result["step_seconds_stock"] / result["step_seconds_fast"]) < 1e-9
    assert set(result["copy_ms_stock"]) == set(result["copy_ms_fast"]) == {
        "aten::_foreach_copy_", "fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", RS_COPY_IN.replace(".", "::")}
    assert all(v > 0 for v in result["copy_ms_stock"].values())


# Each command line in turn through the script's own entry (run as __main__, argv set), in one
# process: the exit status and what went to stderr, as JSON. Training is not started here: a
# command line that is not refused reaches mp.spawn, which raises instead.
_REFUSALS_SCRIPT = """
import contextlib, io, json, runpy, sys
import torch.multiprocessing as mp

def spawn(*a, **kw):
    raise RuntimeError("not refused: training would start")

mp.spawn = spawn
example, seen = sys.argv[1], []
for args in json.loads(sys.argv[2]):
    sys.argv, err = [example, *args], io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            runpy.run_path(example, run_name="__main__")
        code = "returned"
    except SystemExit as e:
        code = e.code
    except Exception as e:
        code = f"raised {type(e).__name__}: {e}"
    seen.append([code, err.getvalue()])
print(json.dumps(seen))
"""

_REFUSED = ((["--world-size", "0"], "--world-size: must be at least 1"),
            (["--steps", "0"], "--steps: must be at least 1"),
            (["--steps", "x"], "is not a whole number"),
            (["--device", "tpu"], "invalid choice"),
            (["--emulate"], "--emulate needs --device npu"),
            (["--device", "npu", "--cann", "8.0.RC3"], "--cann needs --emulate"))


def test_the_command_line_refuses_what_it_cannot_run():
    proc = subprocess.run([sys.executable, "-c", _REFUSALS_SCRIPT, EXAMPLE, json.dumps([a for a, _ in _REFUSED])],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(seen) == len(_REFUSED)
    for (args, text), (code, stderr) in zip(_REFUSED, seen):
        assert code == 2 and text in stderr, (args, code, stderr[-500:])


def _example_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fsdp_train_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_run_ends_with_one_verdict_line_and_no_profiler_noise(runs):
    proc = runs["verdict"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("verdict: the mode served ") and "fell back, bitwise equal" in lines[-1]
    assert "launches per step" in lines[-1] or "emulated npu: not available here" in lines[-1]
    assert "USDT" not in proc.stdout + proc.stderr and "profiler_start" not in proc.stdout + proc.stderr


def test_the_verdict_reads_the_band_of_the_paired_step_ratios():
    ex = _example_module()
    stock, fast = [9.0, 9.0, 2.0, 2.2, 2.1, 2.0], [9.0, 9.0, 1.0, 1.0, 1.0, 1.0]  # two warm-up steps
    med, lo, hi = ex.step_ratio_band(stock, fast)
    assert med == statistics.median([2.0, 2.2, 2.1, 2.0]) and 2.0 <= lo <= med <= hi <= 2.2
    result = {"bitwise_equal": True, "grads_equal_every_step": True, "params_equal_every_step": True,
              "fast_path_calls": 10, "fallback_calls": 2, "step_ratio_band": (med, lo, hi),
              "npu_launches": {"stock": 132, "fast": 41, "cann": "8.0.RC3"}}
    line = ex.verdict(result)
    assert line == (f"verdict: the mode served 10 copy calls on the fast path, 2 fell back, bitwise equal; "
                    f"step {med:.2f}x of stock's speed (faster: 95 % band {lo:.2f}x to {hi:.2f}x); "
                    "emulated npu (CANN 8.0.RC3): 132 -> 41 launches per step")
    result.update(step_ratio_band=(1.01, 0.97, 1.04), npu_launches=None, params_equal_every_step=False)
    assert "bitwise DIFFERENT; step 1.01x of stock's speed (no measurable change: 95 % band 0.97x to 1.04x); " \
           "emulated npu: not available here" in ex.verdict(result)
    result.update(step_ratio_band=(0.9, 0.85, 0.95))
    assert "(slower: 95 % band 0.85x to 0.95x)" in ex.verdict(result)
