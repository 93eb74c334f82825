"""Devices whose batched kernel is exact only on the whole lists stock gives it (CUDA: see
capabilities.py ``whole_list_only``). The call goes to stock's op whole: one foreach group where
stock batches the list, else a whole-stock plan with reason ``whole_list_route``.

The rules are driven on the CPU by an override that gives CPU tensors a ``whole_list_only`` entry;
tests/test_cuda.py checks the bits on a GPU.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings

import npu_dispatch as nd
from npu_dispatch import _native, capabilities
from npu_dispatch.errors import FastCopyFallbackError
from npu_dispatch.plan import build_plan
from cases import assert_same, bits, build, cases, direct_copy, mode_copy, op_copy, run, stock_copy

f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
ENTRIES = [direct_copy, op_copy, mode_copy]


def whole_list_cpu():
    cap = dataclasses.replace(capabilities.lookup("cpu"), name="cuda-like", max_tensors_per_launch=110,
                              whole_list_only=True)
    return capabilities.override({"cpu": cap})


def batched_list():
    # Adjacent destinations (a run elsewhere), an empty pair, one dtype pair: stock batches it.
    g = torch.Generator().manual_seed(0)
    sizes = [5, 0, 17, 64] * 60
    dst = list(torch.zeros(sum(sizes), dtype=bf16).split(sizes))
    src = [torch.randn(n, generator=g) for n in sizes]
    return dst, src


def pair_by_pair_lists():
    return {
        "two_source_dtypes": ([torch.zeros(3), torch.zeros(4)], [torch.ones(3), torch.ones(4, dtype=f16)]),
        "two_destination_dtypes": ([torch.zeros(3), torch.zeros(4, dtype=bf16)], [torch.ones(3), torch.ones(4)]),
        "strides_differ": ([torch.zeros(3, 2).t(), torch.zeros(2)], [torch.ones(2, 3), torch.ones(2)]),
        "not_dense": ([torch.zeros(6)[::2], torch.zeros(2)], [torch.ones(3), torch.ones(2)]),
        "broadcast": ([torch.zeros(2, 3)], [torch.ones(3)]),
    }


def test_a_list_stock_batches_is_one_group_of_every_non_empty_pair():
    with whole_list_cpu():
        dst, src = batched_list()
        p = build_plan(dst, src)
    assert p.stock_reason is None and not p.runs and not p.fallback
    assert [g.indices for g in p.groups] == [[i for i in range(240) if i % 4 != 1]]
    assert p.groups[0].launches == 2 and p.empty == list(range(1, 240, 4))


@pytest.mark.parametrize("name", sorted(pair_by_pair_lists()))
def test_a_list_stock_copies_pair_by_pair_goes_to_stock_whole(name):
    with whole_list_cpu():
        dst, src = pair_by_pair_lists()[name]
        p = build_plan(dst, src)
    assert p.stock_reason is not None and p.stock_reason[0] == "whole_list_route"
    assert p.stock_reason[1].startswith("cuda-like: stock's batched kernel takes only whole lists")


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", ["batched"] + sorted(pair_by_pair_lists()))
def test_results_and_versions_are_stocks(entry, name):
    def outcome(fn):
        dst, src = batched_list() if name == "batched" else pair_by_pair_lists()[name]
        fn(dst, src)
        return [bits(d) for d in dst], [d._version for d in dst]

    want = outcome(stock_copy)
    with whole_list_cpu():
        got = outcome(entry)
    assert all(torch.equal(a, b) for a, b in zip(want[0], got[0])) and got[1] == want[1]


def test_stats_count_the_batched_list_as_one_foreach_group_and_the_other_as_stock():
    mode = nd.NpuFastCopyMode()
    with whole_list_cpu(), mode:
        torch._foreach_copy_(*batched_list())
        torch._foreach_copy_(*pair_by_pair_lists()["two_source_dtypes"])
    s = mode.stats.as_dict()
    assert s["paths"]["foreach"] == {"calls": 1, "tensors": 180, "bytes": 60 * (5 + 17 + 64) * 2, "launches": 2}
    assert s["paths"]["stock"]["tensors"] == 2 and s["fallback_reasons"] == {"whole_list_route": 1}


def test_strict_refuses_a_list_stock_copies_pair_by_pair_before_writing():
    dst, src = pair_by_pair_lists()["two_source_dtypes"]
    with whole_list_cpu(), pytest.raises(FastCopyFallbackError, match="whole lists"):
        with nd.NpuFastCopyMode(strict=True):
            torch._foreach_copy_(dst, src)
    assert all(not d.any() for d in dst)


@pytest.mark.skipif(not _native.available(), reason="native library not built")
def test_the_fast_lane_leaves_such_a_device_to_the_planner():
    before = _native.info()["fast_lane_calls"]
    with whole_list_cpu():
        nd.foreach_copy_([torch.zeros(3)], [torch.ones(3)])
    assert _native.info()["fast_lane_calls"] == before


@pytest.mark.skipif(not _native.available(), reason="native library not built")
@settings(max_examples=60, deadline=None)
@given(cases(max_len=120))
def test_the_cpp_planner_takes_the_same_decisions(case):
    from npu_dispatch._native_plan import native_plan

    with whole_list_cpu():
        dsts, srcs, _ = build(case)
        assert native_plan(dsts, srcs) == build_plan(dsts, srcs)
        assert str(nd.explain(dsts, srcs)) == str(build_plan(dsts, srcs))


@settings(max_examples=60, deadline=None)
@given(cases(max_len=120))
def test_random_lists_match_stock(case):
    # Aliasing lists included: stock's op takes those whole too, as on the device.
    stock = run(case, stock_copy)
    with whole_list_cpu():
        ours = run(case, mode_copy)
    assert_same(stock, ours)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
def test_overlapping_destinations_in_a_batched_list_get_stocks_result(entry):
    # Elsewhere overlap sends a call to stock's copy_ loop; here stock's own op takes it whole.
    def outcome(fn):
        base = torch.arange(8.0)
        fn([base[0:4], base[2:6]], [torch.ones(4), torch.full((4,), 2.0)])
        return base, base._version

    want = outcome(stock_copy)
    with whole_list_cpu():
        assert build_plan([torch.zeros(8)[0:4], torch.zeros(8)[2:6]], [torch.ones(4)] * 2).groups
        got = outcome(entry)
    assert torch.equal(want[0], got[0]) and want[1] == got[1]


@pytest.mark.skipif(not _native.available(), reason="native library not built")
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
def test_the_group_is_handed_to_stocks_op_not_to_this_librarys_kernel(entry):
    before = _native.info()["kernel_passes"]
    with whole_list_cpu():
        entry(*batched_list())
    assert _native.info()["kernel_passes"] == before
