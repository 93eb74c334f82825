"""The benchmark suite (benchmarks/): its JSON shape, its metrics, the FSDP2
example's row, and the correctness of its workloads.

No timing assertions: only structure, metrics computed from the medians, and that each workload's
direct op and mode write exactly stock's bits.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

import npu_dispatch
from benchmarks import __main__ as bench_main
from benchmarks import report, suite, workers, workloads

_ONLY = ["tiny_many", "mode_overhead"]
_NATIVE = npu_dispatch._native.available()


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = ["--quick", "--only", ",".join(_ONLY), "--json", "--rounds", "1", "--min-run-time", "0.001",
            "--threads", "1", "--out", str(out)]
    return argv, out


def _medians(row: dict) -> dict:
    return {k: v["median_us"] for k, v in row["times_us"].items()}


def test_quick_json_structure(quick_run, capsys):
    argv, out = quick_run
    assert bench_main.main(argv) == 0
    result = json.loads(capsys.readouterr().out)  # exactly one JSON object on stdout
    assert result["schema"] == 1
    assert result["config"]["threads"] == 1 and result["config"]["only"] == _ONLY
    assert result["config"]["quick"] is True
    assert {"cpu", "torch_threads", "torch", "native_extension", "date"} <= result["machine"].keys()
    assert isinstance(result["machine"]["native_extension"]["present"], bool)
    assert [r["name"] for r in result["workloads"]] == _ONLY
    tiny, overhead = result["workloads"]

    assert set(tiny["times_us"]) == {"stock", "direct", "mode", "roofline"}
    assert set(overhead["times_us"]) == {"no_mode", "mode", "debug_mode"}
    for row in (tiny, overhead):
        for t in row["times_us"].values():
            assert t["median_us"] > 0 and t["blocks"] >= 1 and len(t["round_medians_us"]) == 1
        assert isinstance(row["pass"], bool)

    # The metrics, from the medians of the same run.
    med, m = _medians(tiny), tiny["metrics"]
    assert m["speedup_direct"] == med["stock"] / med["direct"]
    assert m["speedup_mode"] == med["stock"] / med["mode"]
    assert m["efficiency_direct"] == med["roofline"] / med["direct"]
    assert m["mode_vs_bound"] == m["speedup_mode"] / m["speedup_direct"]
    med = _medians(overhead)
    assert overhead["metrics"] == {"extra_us_vs_no_mode": med["mode"] - med["no_mode"],
                                   "debug_extra_us_vs_no_mode": med["debug_mode"] - med["no_mode"]}

    # The checks read the targets: the direct op's, and through the mode only against the bound.
    assert [c["target"] for c in tiny["checks"]] == ["speedup_direct >= 6", "mode_vs_bound >= 0.9"]
    assert [c["target"] for c in overhead["checks"]] == ["extra_us_vs_no_mode <= 0.1"]
    for row in (tiny, overhead):
        for c in row["checks"]:
            assert c["value"] == row["metrics"][c["metric"]]
            assert c["pass"] == (c["value"] >= 6 if c["metric"] == "speedup_direct" else
                                 c["value"] >= 0.9 if c["metric"] == "mode_vs_bound" else c["value"] <= 0.1)
        assert row["pass"] == (all(c["pass"] for c in row["checks"]) and all(row.get("bitwise_equal", {}).values()))

    assert tiny["pairs"] == 512 and tiny["elements"] == sum(workloads.TINY_SIZES)
    assert tiny["bitwise_equal"] == {"direct": True, "mode": True}
    assert tiny["launches"] >= 1 and sum(tiny["paths"].values()) == 512

    assert json.loads((out / "benchmarks.json").read_text()) == result
    md = (out / "benchmarks.md").read_text()
    assert f"| tiny_many | 512 | {sum(workloads.TINY_SIZES):,} |" in md
    assert f"| {m['speedup_mode']:.2f}x | {m['mode_vs_bound']:.2f} | {m['efficiency_direct']:.2f} |" in md
    assert f"| mode_overhead | {report._us(med['no_mode'])} | {report._us(med['mode'])} |" in md
    assert "| tiny_many | mode_vs_bound >= 0.9 |" in md
    if _has_matplotlib():
        assert (out / "benchmarks.png").stat().st_size > 0


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_unknown_workload_is_an_error(capsys):
    assert bench_main.main(["--quick", "--only", "nope"]) == 2
    assert "tiny_many" in capsys.readouterr().err


def test_copy_metrics_read_the_direct_op_as_the_bound():
    med = {"stock": 120.0, "direct": 10.0, "mode": 30.0, "roofline": 5.0}
    m = suite.metrics_of("foreach", med)
    assert (m["speedup_direct"], m["speedup_mode"]) == (12.0, 4.0)
    assert m["mode_vs_bound"] == 4.0 / 12.0
    assert (m["efficiency_direct"], m["efficiency_mode"]) == (0.5, 5.0 / 30.0)
    assert suite.metrics_of("all_gather_copy_in", med)["mode_vs_bound"] == 4.0 / 12.0


def _bits(ts):
    return [t.contiguous().reshape(-1).view(torch.uint8) for t in ts]


@pytest.mark.parametrize("name", ["tiny_many", "small_many", "small_many_cast", "adjacent"])
def test_direct_op_matches_stock_bitwise(name):
    # Two independent builds from the workload's fixed seed: stock writes one, the direct op the other.
    (w,) = workloads.by_name([name])
    ref, ours = w.build(), w.build()
    assert all(torch.equal(a, b) for a, b in zip(ref.srcs, ours.srcs)), "builder is not deterministic"
    torch._foreach_copy_(ref.dsts, ref.srcs)
    npu_dispatch.foreach_copy_(ours.dsts, ours.srcs)
    assert all(torch.equal(a, b) for a, b in zip(_bits(ref.dsts), _bits(ours.dsts)))
    if name == "adjacent":  # the views really are adjacent: the fast path may coalesce them
        assert ours.dsts[1].data_ptr() == ours.dsts[0].data_ptr() + ours.dsts[0].nbytes


def test_copy_in_shapes_follow_fsdp2():
    sizes = [workloads._shard_numel(s, workloads.LLAMA_WORLD_SIZE) for _, s in workloads.LLAMA_BLOCK]
    assert sizes[0] == 512 * 4096 and sizes[4] == 1792 * 4096 and sizes[-1] == 512
    assert workloads._shard_numel((10, 3), 8) == 2 * 3  # dim 0 padded to a multiple of world size


def test_copy_in_variants_match_stock_bitwise():
    # The suite's all_gather_copy_in path, on a small stand-in for the Llama block (which the suite
    # itself checks at full size on every run).
    g = torch.Generator().manual_seed(0)
    sizes = [48, 16, 64]
    args = workloads.CopyInArgs([torch.randn(n, generator=g) for n in sizes], torch.zeros(4 * 128),
                                sizes, 128, 2, 4)
    by = {v.name: v for v in suite.variants(args)}
    assert set(by) == {"stock", "direct", "mode", "roofline"}
    equal = suite.bitwise_check(args.outputs, by["stock"].run_once,
                                {"direct": by["direct"].run_once, "mode": by["mode"].run_once})
    assert equal == {"direct": True, "mode": True}
    assert torch.equal(args.output[256:384], torch.cat(args.inputs))


# What examples/fsdp_train.py --json prints (trimmed to what the suite reads, plus a few others).
_EXAMPLE = {
    "steps": 6, "world_size": 2, "device": "cpu", "losses_stock": [5.5], "losses_fast": [5.5],
    "bitwise_equal": True, "grads_equal_every_step": True, "params_equal_every_step": True,
    "step_seconds_stock": 0.05, "step_seconds_fast": 0.04, "step_speedup": 1.25, "timed_steps": 4,
    "copy_ms_stock": {"aten::_foreach_copy_": 0.25, "fsdp::all_gather_copy_in": 0.5},
    "copy_ms_fast": {"aten::_foreach_copy_": 0.0, "fsdp::all_gather_copy_in": 0.25},
    "fast_path_calls": 126, "fallback_calls": 0,
}


def test_example_metrics_parse_the_examples_json():
    m = suite.example_metrics(_EXAMPLE)
    assert m == {
        "step_seconds_stock": 0.05, "step_seconds_fast": 0.04, "step_speedup": 0.05 / 0.04,
        "copy_ms_stock": 0.75, "copy_ms_fast": 0.25, "copy_share_stock": 0.75 / 50.0,
        "bitwise_equal": True, "grads_equal_every_step": True, "params_equal_every_step": True,
    }
    assert suite.example_metrics(dict(_EXAMPLE, params_equal_every_step=False))["params_equal_every_step"] is False


def _fake_example(monkeypatch, answer: dict | None, returncode: int = 0) -> list:
    """subprocess.run for the example: records each command, prints a noise line then ``answer``."""
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        out = "rank 0 says hello\n" + ("" if answer is None else json.dumps(answer) + "\n")
        return subprocess.CompletedProcess(cmd, returncode, stdout=out)

    monkeypatch.setattr(subprocess, "run", fake_run)
    return calls


def test_fsdp_step_runs_the_example_once(monkeypatch):
    (w,) = workloads.by_name(["fsdp_step"])
    calls = _fake_example(monkeypatch, _EXAMPLE)
    # Three worker processes asked for: the example starts its own, so it runs once, here.
    row = workers.run_in_workers(w, suite.Config(1, 0.001, 1, quick=True), 3)
    (cmd,) = calls
    assert cmd[:2] == [sys.executable, workloads.FSDP_EXAMPLE]
    assert cmd[2:] == ["--steps", "6", "--world-size", "2", "--json"]
    assert row["kind"] == "example" and row["metrics"] == suite.example_metrics(_EXAMPLE)
    assert row["command"] == "python examples/fsdp_train.py --steps 6 --world-size 2 --json"
    assert (row["steps"], row["timed_steps"], row["fast_path_calls"]) == (6, 4, 126)
    assert row["bitwise_equal"] == {"losses": True, "grads": True, "params": True}
    assert row["checks"] == [{"target": "step_speedup >= 1", "metric": "step_speedup",
                              "value": 0.05 / 0.04, "pass": True}] and row["pass"] is True
    md = report.tables({"workloads": [row]})
    assert "| fsdp_step | 4 of 6 | 50.0 | 40.0 | 1.25x | 0.75 / 0.25 | 1.5 % | yes, yes, yes | PASS |" in md

    calls.clear()
    row = suite.run_workload(w, suite.Config(1, 0.001, 1))  # a full run: 40 steps
    assert calls[0][2:4] == ["--steps", "40"] and row["pass"] is True


def test_fsdp_step_fails_when_slower_or_not_equal(monkeypatch):
    (w,) = workloads.by_name(["fsdp_step"])
    cfg = suite.Config(1, 0.001, 1, quick=True)
    _fake_example(monkeypatch, dict(_EXAMPLE, step_seconds_fast=0.06))
    row = suite.run_workload(w, cfg)
    assert row["checks"][0]["pass"] is False and row["pass"] is False
    assert "FAIL (step_speedup >= 1)" in report.tables({"workloads": [row]})
    _fake_example(monkeypatch, dict(_EXAMPLE, grads_equal_every_step=False))
    row = suite.run_workload(w, cfg)
    assert row["checks"][0]["pass"] is True and row["pass"] is False
    assert "| yes, NO, yes |" in report.tables({"workloads": [row]})
    # A failed or silent example makes an error row, not a crash.
    _fake_example(monkeypatch, _EXAMPLE, returncode=1)
    assert suite.run_workload(w, cfg)["error"].startswith("example exited with 1")
    _fake_example(monkeypatch, None)
    assert "0 JSON lines" in suite.run_workload(w, cfg)["error"]
    _fake_example(monkeypatch, {k: v for k, v in _EXAMPLE.items() if k != "copy_ms_stock"})
    assert "KeyError" in suite.run_workload(w, cfg)["error"]


def test_fsdp_step_is_skipped_without_the_example(monkeypatch, tmp_path):
    (w,) = workloads.by_name(["fsdp_step"])
    monkeypatch.setattr(workloads, "FSDP_EXAMPLE", str(tmp_path / "fsdp_train.py"))
    calls = _fake_example(monkeypatch, _EXAMPLE)
    row = suite.run_workload(w, suite.Config(1, 0.001, 1, quick=True))
    assert calls == [] and "pass" not in row
    assert row["skipped"].startswith("FileNotFoundError") and "fsdp_train.py" in row["skipped"]
    assert "| fsdp_step | SKIP: FileNotFoundError" in report.tables({"workloads": [row]})


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed")
def test_fsdp_step_reads_the_real_example():
    # One step of the real example (2 gloo ranks): its JSON has every key the row reads.
    (w,) = workloads.by_name(["fsdp_step"])
    one = dataclasses.replace(w, build=lambda: dataclasses.replace(w.build(), quick_steps=1))
    row = suite.run_workload(one, suite.Config(1, 0.001, 1, quick=True))
    assert "error" not in row and row["steps"] == 1 and row["world_size"] == 2
    m = row["metrics"]
    assert m["step_seconds_stock"] > 0 and m["step_seconds_fast"] > 0
    assert m["step_speedup"] == m["step_seconds_stock"] / m["step_seconds_fast"]
    assert 0 < m["copy_share_stock"] < 1
    assert row["bitwise_equal"] == {"losses": True, "grads": True, "params": True}
    if _NATIVE:
        assert row["fast_path_calls"] > 0 and row["fallback_calls"] == 0


def test_timing_merge_is_the_median_of_the_processes_medians():
    from benchmarks.timing import Timing

    # A process that ran many short blocks weighs no more than another.
    a, b, c = Timing.of([1.0, 2.0, 3.0], [2.0]), Timing.of([10.0] * 9, [10.0]), Timing.of([4.0, 6.0], [5.0])
    m = Timing.merge([a, b, c])
    assert (m.median_us, m.blocks, m.round_medians_us) == (5.0, 14, [2.0, 10.0, 5.0])
    assert m.block_us == sorted([1.0, 2.0, 3.0, 4.0, 6.0] + [10.0] * 9)
    assert "block_us" not in m.as_dict() and m.as_dict(blocks=True)["block_us"] == m.block_us


def test_worker_processes_merge_into_one_row(capsys):
    # Two fresh processes, one round each: the row keeps each process's medians and metrics, its
    # times are the median of those medians, its metrics the median of each process's.
    argv = ["--only", "small_many_cast", "--processes", "2", "--rounds", "1", "--min-run-time", "0.001",
            "--threads", "1", "--json"]
    assert bench_main.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"]["processes"] == 2 and result["config"]["rounds"] == 1
    (row,) = result["workloads"]
    assert row["processes"] == 2 and row["bitwise_equal"] == {"direct": True, "mode": True}
    assert set(row["times_us"]) == {"stock", "direct", "mode", "roofline"}
    for name, t in row["times_us"].items():
        assert len(t["round_medians_us"]) == 2 and t["blocks"] >= 2
        assert t["median_us"] == sum(row["process_medians_us"][name]) / 2
    for pm, medians in zip(row["process_metrics"], zip(*[row["process_medians_us"][k] for k in row["times_us"]])):
        assert pm == suite.metrics_of("foreach", dict(zip(row["times_us"], medians)))
    for key, value in row["metrics"].items():
        per = [pm[key] for pm in row["process_metrics"]]
        assert value == (None if None in per else sum(per) / 2)
    assert row["checks"] and row["launches"] >= 1


def test_processes_must_be_positive(capsys):
    with pytest.raises(SystemExit) as info:
        bench_main.main(["--quick", "--only", "tiny_many", "--processes", "0"])
    assert info.value.code == 2 and "--processes" in capsys.readouterr().err


def _fake_workers(monkeypatch, answers):
    """subprocess.run for workers.py: each call writes the next of ``answers`` (a row's
    bitwise verdicts and timed variants, or an exit status) to the worker's --result file."""
    import types

    answers = iter(answers)
    t = {"median_us": 1.0, "iqr_us": 0.0, "blocks": 1, "round_medians_us": [1.0], "block_us": [1.0]}

    def fake_run(cmd, **kw):
        answer = next(answers)
        if isinstance(answer, int):
            return types.SimpleNamespace(returncode=answer)
        bitwise, names = answer
        row = {"name": "adjacent", "description": "", "kind": "foreach", "bitwise_equal": bitwise}
        with open(cmd[cmd.index("--result") + 1], "w") as f:
            json.dump({"row": row, "timings": {n: t for n in names}}, f)
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(subprocess, "run", fake_run)


_VARIANTS = ["stock", "direct", "mode", "roofline"]


def test_a_bitwise_miss_in_any_worker_fails_the_merged_row(monkeypatch):
    (w,) = workloads.by_name(["adjacent"])
    answers = [({"direct": True, "mode": True}, _VARIANTS), ({"direct": True, "mode": False}, _VARIANTS)]
    _fake_workers(monkeypatch, answers)
    row = workers.run_in_workers(w, suite.Config(1, 0.001, 1), 2)
    assert row["bitwise_equal"] == {"direct": True, "mode": False} and row["pass"] is False
    assert row["times_us"]["direct"]["blocks"] == 2
    # Every time 1 us: every ratio 1, so the mode target passes and the direct-op ones fail.
    assert row["metrics"]["mode_vs_bound"] == 1.0
    assert [c["pass"] for c in row["checks"]] == [False, True, True]


def test_a_failed_or_inconsistent_worker_makes_an_error_row(monkeypatch):
    (w,) = workloads.by_name(["adjacent"])
    cfg = suite.Config(1, 0.001, 1)
    _fake_workers(monkeypatch, [({"direct": True}, _VARIANTS), 3])
    row = workers.run_in_workers(w, cfg, 2)
    assert row["error"].startswith("process 2: worker exited with 3") and "pass" not in row
    _fake_workers(monkeypatch, [({"direct": True}, _VARIANTS), ({"direct": True}, _VARIANTS[:-1])])
    assert "different variants" in workers.run_in_workers(w, cfg, 2)["error"]
    result = {"workloads": [row], "config": {"rounds": 1, "processes": 2}}
    assert "| adjacent | ERROR: process 2" in report.tables(result)


def test_merged_metrics_are_each_metrics_median():
    per = [{"speedup_direct": 2.0, "efficiency_mode": 3.0},
           {"speedup_direct": 4.0, "efficiency_mode": None}]
    assert workers._merged_metrics(per) == {"speedup_direct": 3.0, "efficiency_mode": None}
