"""The benchmark suite (npu_dispatch/bench/): its JSON shape and the correctness of its workloads.

No timing assertions: only structure, and that each workload's direct op writes exactly stock's bits.
"""
from __future__ import annotations

import json

import pytest
import torch

import npu_dispatch
from npu_dispatch.bench import __main__ as bench_main
from npu_dispatch.bench import suite, workloads

_ONLY = ["tiny_many", "mode_overhead"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = ["--quick", "--only", ",".join(_ONLY), "--json", "--rounds", "1", "--min-run-time", "0.001",
            "--threads", "1", "--out", str(out)]
    return argv, out


def test_quick_json_structure(quick_run, capsys):
    argv, out = quick_run
    assert bench_main.main(argv) == 0
    result = json.loads(capsys.readouterr().out)  # exactly one JSON object on stdout
    assert result["schema"] == 1
    assert result["config"]["threads"] == 1 and result["config"]["only"] == _ONLY
    assert {"cpu", "torch_threads", "torch", "native_extension", "date"} <= result["machine"].keys()
    assert isinstance(result["machine"]["native_extension"]["present"], bool)
    assert [r["name"] for r in result["workloads"]] == _ONLY
    tiny, overhead = result["workloads"]

    floor = ({"pair_floor", "call_floor", "flat_direct", "copy_floor", "direct_copy_floor", "parallel_region",
              "null_route", "null_route_copy"}
             if npu_dispatch._native.available() else set())
    assert set(tiny["times_us"]) == {"stock", "direct", "mode", "mode_front", "bare_mode", "null_mode", "roofline"} | floor
    assert set(overhead["times_us"]) == {"no_mode", "bare_mode", "mode"}
    for row in (tiny, overhead):
        for t in row["times_us"].values():
            assert t["median_us"] > 0 and t["blocks"] >= 1 and len(t["round_medians_us"]) == 1
        assert row["checks"] and all(isinstance(c["pass"], bool) for c in row["checks"])
        assert isinstance(row["pass"], bool)
    assert {"speedup_direct", "speedup_mode", "speedup_mode_front", "efficiency_direct",
            "efficiency_bound"} <= tiny["metrics"].keys()
    if floor:
        # Two estimates from the floors and the roofline; the checks read the higher one.
        m = tiny["metrics"]
        assert 0 < m["efficiency_bound_after_copy"] and 0 < m["efficiency_bound_hot"]
        assert m["efficiency_bound"] == max(m["efficiency_bound_hot"], m["efficiency_bound_after_copy"])
        (mode_check,) = [c for c in tiny["checks"] if c["metric"] == "speedup_mode"]
        assert mode_check["ceiling"] == m["speedup_mode_ceiling"]
        med = {k: v["median_us"] for k, v in tiny["times_us"].items()}
        assert m["speedup_mode_ceiling"] == med["stock"] / min(med["null_mode"], med["null_route"])
        pair_work = max(med["pair_floor"] - med["call_floor"], 0.0)
        assert m["speedup_mode_estimate"] == med["stock"] / (med["null_route_copy"] + pair_work)
    assert "extra_us_vs_bare_mode" in overhead["metrics"]

    assert tiny["pairs"] == 512 and tiny["elements"] == sum(workloads.TINY_SIZES)
    assert tiny["bitwise_equal"] == {"direct": True, "mode": True, "mode_front": True}
    assert tiny["launches"] >= 1 and sum(tiny["paths"].values()) == 512

    assert json.loads((out / "benchmarks.json").read_text()) == result
    md = (out / "benchmarks.md").read_text()
    assert "tiny_many" in md and "| workload |" in md
    if floor:
        m = tiny["metrics"]
        assert f"| {m['speedup_mode_ceiling']:.2f}x / {m['speedup_mode_estimate']:.2f}x |" in md
        region = tiny["times_us"]["parallel_region"]["round_medians_us"][0]
        assert f"| tiny_many | parallel region | {region:.3g} |" in md
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
    equal = suite.bitwise_check(args.outputs, by["stock"].run_once,
                                {"direct": by["direct"].run_once, "mode": by["mode"].run_once})
    assert equal == {"direct": True, "mode": True}
    assert torch.equal(args.output[256:384], torch.cat(args.inputs))


def test_pair_floor_touches_every_pair_and_copies_nothing():
    if not npu_dispatch._native.available():
        pytest.skip(f"native library not built: {npu_dispatch._native.status()[1]}")
    touch = npu_dispatch._native.module().touch_pairs
    d, s = [torch.zeros(3), torch.zeros(2)], [torch.ones(3), torch.ones(2)]
    touch(d, s)
    assert [t._version for t in d] == [1, 1] and all(t.count_nonzero() == 0 for t in d)
    with pytest.raises(TypeError):
        touch(d, s[:1])


def test_copy_floor_is_the_faster_flat_copy_then_the_pairs_less_the_call():
    med = {"copy_floor": 12.0, "direct_copy_floor": 10.0, "call_floor": 0.5}
    assert suite.copy_floor(med) == 9.5
    assert suite.copy_floor({"roofline": 3.0}) is None


def test_copy_floor_variants_copy_then_touch_every_pair():
    if not npu_dispatch._native.available():
        pytest.skip(f"native library not built: {npu_dispatch._native.status()[1]}")
    args = workloads.ForeachArgs([torch.zeros(3), torch.zeros(5)], [torch.ones(3), torch.ones(5)])
    by = {v.name: v for v in suite.variants(args)}
    for name in ("copy_floor", "direct_copy_floor"):
        by[name].run_once()
    # Each statement moved the flat buffers' bytes and bumped every listed destination once.
    assert [t._version for t in args.dsts] == [2, 2] and all(t.count_nonzero() == 0 for t in args.dsts)
    flat = by["copy_floor"].globals["flat_dst"]
    assert torch.equal(flat, by["copy_floor"].globals["flat_src"])


def test_null_route_copy_moves_the_flat_bytes_and_leaves_the_lists():
    if not npu_dispatch._native.available():
        pytest.skip(f"native library not built: {npu_dispatch._native.status()[1]}")
    args = workloads.ForeachArgs([torch.zeros(3), torch.zeros(5)], [torch.ones(3), torch.ones(5)])
    by = {v.name: v for v in suite.variants(args)}
    g = by["null_route_copy"].globals
    flat_dst, flat_src = g["flat_dst"], g["flat_src"]
    calls = npu_dispatch._native.module().mode_route_calls()
    with by["null_route_copy"].context():
        flat_dst.zero_()  # entering copied the pair once, to check it
        exec(by["null_route_copy"].stmt, g)
        # The route took the call (no copy counted, nothing written to the lists, no version
        # moved) and moved the flat pair's bytes instead.
        assert torch.equal(flat_dst, flat_src) and flat_src.count_nonzero() > 0
    assert npu_dispatch._native.module().mode_route_calls() == calls
    assert [t._version for t in args.dsts] == [0, 0] and all(t.count_nonzero() == 0 for t in args.dsts)


def test_null_route_copy_refuses_a_pair_the_lane_refuses():
    if not npu_dispatch._native.available():
        pytest.skip(f"native library not built: {npu_dispatch._native.status()[1]}")
    a, b = torch.zeros(8), torch.ones(8)
    with pytest.raises(ValueError, match="fast lane refuses"):
        with suite.NullRoute((a[::2], b[::2])):
            pass
    assert torch._C._len_torch_dispatch_stack() == 0 and a.count_nonzero() == 0
    module = npu_dispatch._native.module()
    with pytest.raises(TypeError, match="mode_route_enter"):
        module.mode_route_enter(suite.NullRoute(), True, a)
    with pytest.raises(TypeError, match="only with probe"):
        module.mode_route_enter(suite.NullRoute(), False, a, b)
    assert torch._C._len_torch_dispatch_stack() == 0 and a.count_nonzero() == 0


def test_bound_column_shows_both_estimates():
    from npu_dispatch.bench import report

    assert report._bounds({"efficiency_bound_hot": 0.77, "efficiency_bound_after_copy": 0.7}) == "0.77 / 0.70"
    assert report._bounds({}) == "-"


def test_timing_merge_is_the_median_of_the_processes_medians():
    from npu_dispatch.bench.timing import Timing

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
    assert row["processes"] == 2 and row["bitwise_equal"] == {"direct": True, "mode": True, "mode_front": True}
    for name, t in row["times_us"].items():
        assert len(t["round_medians_us"]) == 2 and t["blocks"] >= 2
        assert t["median_us"] == sum(row["process_medians_us"][name]) / 2
    m = row["metrics"]
    for key, value in m.items():
        per = [pm[key] for pm in row["process_metrics"]]
        if key != "efficiency_bound":
            assert value == (None if None in per else sum(per) / 2)
    known = [b for b in (m["efficiency_bound_hot"], m["efficiency_bound_after_copy"]) if b]
    assert m["efficiency_bound"] == (max(known) if known else None)
    assert row["checks"] and row["launches"] >= 1


def test_processes_must_be_positive(capsys):
    with pytest.raises(SystemExit) as info:
        bench_main.main(["--quick", "--only", "tiny_many", "--processes", "0"])
    assert info.value.code == 2 and "--processes" in capsys.readouterr().err


def _fake_workers(monkeypatch, answers):
    """subprocess.run for workers.py: each call writes the next of ``answers`` (a row's
    bitwise verdicts and timed variants, or an exit status) to the worker's --result file."""
    import subprocess
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


_VARIANTS = ["stock", "direct", "mode", "bare_mode", "roofline"]


def test_a_bitwise_miss_in_any_worker_fails_the_merged_row(monkeypatch):
    from npu_dispatch.bench import workers

    (w,) = workloads.by_name(["adjacent"])
    answers = [({"direct": True, "mode": True}, _VARIANTS), ({"direct": True, "mode": False}, _VARIANTS)]
    _fake_workers(monkeypatch, answers)
    row = workers.run_in_workers(w, suite.Config(1, 0.001, 1), 2)
    assert row["bitwise_equal"] == {"direct": True, "mode": False} and row["pass"] is False
    assert row["times_us"]["direct"]["blocks"] == 2


def test_a_failed_or_inconsistent_worker_makes_an_error_row(monkeypatch):
    from npu_dispatch.bench import report, workers

    (w,) = workloads.by_name(["adjacent"])
    cfg = suite.Config(1, 0.001, 1)
    _fake_workers(monkeypatch, [({"direct": True}, _VARIANTS), 3])
    row = workers.run_in_workers(w, cfg, 2)
    assert row["error"].startswith("process 2: worker exited with 3") and "pass" not in row
    _fake_workers(monkeypatch, [({"direct": True}, _VARIANTS), ({"direct": True}, _VARIANTS[:-1])])
    assert "different variants" in workers.run_in_workers(w, cfg, 2)["error"]
    result = {"workloads": [row], "config": {"rounds": 1, "processes": 2}}
    assert "ERROR: process 2" in report.tables(result)


def test_merged_bound_is_the_higher_of_the_merged_estimates():
    from npu_dispatch.bench import workers

    # The hot estimate is the higher in one process, the after-copy one in the other: the
    # merged bound is the higher of the two medians (0.8), not the median of each process's
    # higher one (0.85), so it matches the "eff bound" column beside it.
    per = [{"efficiency_bound_hot": 0.9, "efficiency_bound_after_copy": 0.6, "efficiency_bound": 0.9},
           {"efficiency_bound_hot": 0.7, "efficiency_bound_after_copy": 0.8, "efficiency_bound": 0.8}]
    m = workers._merged_metrics(per)
    assert (m["efficiency_bound_hot"], m["efficiency_bound_after_copy"]) == (0.8, 0.7)
    assert m["efficiency_bound"] == 0.8
    per[1]["efficiency_bound_hot"] = None
    assert workers._merged_metrics(per)["efficiency_bound_hot"] is None
