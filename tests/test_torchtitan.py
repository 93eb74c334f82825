"""torchtitan's own trainer (llama3 debugmodel, FSDP2 over 2 gloo ranks, bf16 parameters, fp32
reduce, selective activation checkpointing) through ``--module npu_dispatch.integrations.torchtitan``
is bitwise stock torchtitan's: every step's loss and grad norm and every rank's final parameter
shards; every copy FSDP2 issues in its steps takes the fast path.

Both trainings run side by side under torchrun, each rank through tests/torchtitan_cpu.py (the CPU
shims torchtitan needs, and what the ranks record)."""
from __future__ import annotations

import importlib
import json
import os
import sys

import pytest
import torch

from cases import RS_COPY_IN, run_side_by_side
from npu_dispatch import _native

STEPS = 3
WORLD = 2
HERE = os.path.dirname(os.path.abspath(__file__))
# Small for the suite's time (2 cores); every step still issues each copy FSDP2 makes (forward's
# all-gathers, backward's re-gathers and reduce-scatters), and later steps start from parameters
# the optimizer changed.
COMMON = ["--config", "llama3_debugmodel", "--training.steps", str(STEPS), "--training.local-batch-size", "1",
          "--training.seq-len", "32", "--debug.seed", "0", "--parallelism.spmd-backend", "partial_dtensor",
          "--dataloader.dataset", "npu_dispatch_test", "--override.imports", "torchtitan_cpu.sdpa_attention"]
RUNS = {"stock": ["--module", "llama3"], "mode": ["--module", "npu_dispatch.integrations.torchtitan"]}
# How --module/--config resolve (each spelling, with and without the off switch), against stock's
# config; and that importing npu_dispatch imports no torchtitan. Runs beside the trainings.
_CONFIGS = """
import json, re, sys
import npu_dispatch, npu_dispatch.integrations
before = "torchtitan" in sys.modules
from torchtitan.config import ConfigManager
def fields(config):  # every field but ours, as JSON; a function's repr without its address
    d = config.to_dict()
    return d.pop("npu_dispatch", None), re.sub(r" at 0x[0-9a-f]+", "", json.dumps(d, sort_keys=True, default=repr))
stock = fields(ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel"]))[1]
seen = {}
for spelling in ("llama3.llama3_debugmodel", "llama3_debugmodel", "torchtitan.models.llama3.llama3_debugmodel"):
    for off in ([], ["--npu-dispatch.no-enable"]):
        c = ConfigManager().parse_args(["--module", "npu_dispatch.integrations.torchtitan", "--config", spelling, *off])
        ours, rest = fields(c)
        seen[" ".join([spelling, *off])] = [type(c)._owner.__name__, ours, rest == stock]
print(json.dumps({"torchtitan_imported_by_npu_dispatch": before, "configs": seen}))
"""
# One all-gather group: the cast of the shards into bf16, its copy-in, its copy-out.
ALL_GATHER_COPIES = ("aten._foreach_copy_", "fsdp.all_gather_copy_in", "fsdp.split_with_sizes_copy")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """``{run: [rank 0's record, rank 1's record]}`` (tests/torchtitan_cpu.py _observe), and
    ``"configs"``: what _CONFIGS printed. Skips without torchtitan or the native library."""
    pytest.importorskip("torchtitan", reason="torchtitan not installed (the optional dependency of "
                        "npu_dispatch.integrations.torchtitan: pip install torchtitan==0.3.0)")
    if not _native.available():
        if os.environ.get("NPU_DISPATCH_REQUIRE_NATIVE") == "1":
            pytest.fail(f"native library required: {_native.status()[1]}", pytrace=False)
        pytest.skip(f"native library not built: {_native.status()[1]}")
    root = tmp_path_factory.mktemp("torchtitan")
    commands = {}
    for name, module in RUNS.items():
        (root / name).mkdir()
        commands[name] = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
                          os.path.join(HERE, "torchtitan_cpu.py"), str(root / name), "--",
                          *module, *COMMON, "--dump-folder", str(root / name / "dump")]
    commands["configs"] = [sys.executable, "-c", _CONFIGS]
    repo = os.path.dirname(HERE)
    path = os.pathsep.join([repo, HERE, *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ["PYTHONPATH"], saved = path, os.environ.get("PYTHONPATH")
    try:
        done = run_side_by_side(commands, root, timeout=600)
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    for name, proc in done.items():
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    found = {name: [torch.load(root / name / f"rank{r}.pt") for r in range(WORLD)] for name in RUNS}
    found["configs"] = json.loads(done["configs"].stdout.strip().splitlines()[-1])
    return found


def test_every_step_and_the_final_parameters_are_bitwise_stocks(ranks):
    for stock, mode in zip(ranks["stock"], ranks["mode"]):
        assert (stock["trainer"], mode["trainer"]) == ("Trainer", "NpuFastCopyTrainer")
        assert [s["step"] for s in stock["steps"]] == list(range(1, STEPS + 1))
        assert mode["steps"] == stock["steps"]  # loss, max loss, grad norm: float.hex of each
        assert stock["params"].keys() == mode["params"].keys() and len(stock["params"]) > 0
        for name, bits in stock["params"].items():
            assert torch.equal(mode["params"][name], bits), name


def test_every_copy_fsdp2_issues_takes_the_fast_path(ranks):
    for stock, mode in zip(ranks["stock"], ranks["mode"]):
        ops, issued = mode["ops"], mode["collectives"]
        assert issued == stock["collectives"] and issued["all_gather_single"] > 0
        for op in ALL_GATHER_COPIES:
            assert ops[op]["calls"] == ops[op]["fast_calls"] == issued["all_gather_single"], op
        assert ops[RS_COPY_IN]["calls"] == ops[RS_COPY_IN]["fast_calls"] == issued["reduce_scatter_single"] > 0
        assert all(v["fallback_calls"] == 0 and not v["fallbacks"] for v in ops.values()), ops


def test_config_spellings_and_the_off_switch_keep_stocks_config(ranks):
    result = ranks["configs"]
    assert result["torchtitan_imported_by_npu_dispatch"] is False
    for spelling in ("llama3.llama3_debugmodel", "llama3_debugmodel", "torchtitan.models.llama3.llama3_debugmodel"):
        assert result["configs"][spelling] == ["NpuFastCopyTrainer", {"enable": True}, True]
        assert result["configs"][f"{spelling} --npu-dispatch.no-enable"] == ["NpuFastCopyTrainer", {"enable": False}, True]


def test_without_torchtitan_the_module_says_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchtitan", None)  # what an absent package imports as
    monkeypatch.delitem(sys.modules, "npu_dispatch.integrations.torchtitan", raising=False)
    with pytest.raises(ImportError, match="pip install torchtitan"):
        importlib.import_module("npu_dispatch.integrations.torchtitan")
