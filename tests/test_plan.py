"""The planner's decisions, read through ``explain`` and the capability table."""
from __future__ import annotations

import pytest
import torch

import npu_dispatch as nd
from npu_dispatch import _native
from npu_dispatch.capabilities import Capability, npu_capability, override

f32, f16, bf16, f64 = torch.float32, torch.float16, torch.bfloat16, torch.float64


def _fsdp_cast(n, src_dtype=f32, dst_dtype=bf16, adjacent_src=False):
    sizes = [16 + k for k in range(n)]
    dst = list(torch.split(torch.empty(sum(sizes), dtype=dst_dtype), sizes))
    if adjacent_src:
        src = list(torch.split(torch.randn(sum(sizes)).to(src_dtype), sizes))
    else:
        src = [torch.randn(s).to(src_dtype) for s in sizes]
    return dst, src


def test_adjacent_sources_and_destinations_coalesce_into_one_run():
    dst, src = _fsdp_cast(30, adjacent_src=True)
    p = nd.explain(dst, src)
    assert [r.indices for r in p.runs] == [list(range(30))]
    assert p.runs[0].numel == sum(16 + k for k in range(30))
    assert p.groups == [] and p.fallback == [] and p.launches == 1
    assert "coalesced run pairs 0..29: 1 flat copy" in str(p)


def test_mixed_dtypes_break_runs_and_group_by_dtype_pair():
    buf_d, buf_s = torch.empty(40), torch.randn(40)
    dst = list(torch.split(buf_d, 10)) + [torch.empty(5, dtype=bf16), torch.empty(5, dtype=bf16)]
    src = list(torch.split(buf_s, 10)) + [torch.randn(5), torch.randn(5)]
    src[2] = torch.randn(10)  # breaks source adjacency between pairs 1 and 2
    p = nd.explain(dst, src)
    assert [r.indices for r in p.runs] == [[0, 1]]
    assert [(g.indices, g.src_dtype, g.dst_dtype) for g in p.groups] == [([2, 3], f32, f32), ([4, 5], f32, bf16)]


def test_fallback_reasons_in_words():
    dst = [torch.empty(4, 4).t(), torch.empty(3), torch.empty(2, 3), torch.empty(6)[::2], torch.empty(0)]
    src = [torch.randn(4, 4), torch.randn(1), torch.randn(2, 3).to(torch.complex64), torch.randn(3), torch.randn(0)]
    p = nd.explain(dst, src)
    reasons = {i: p.reasons[i][1] for i in p.fallback}
    assert reasons == {
        0: "src[0] strides (4, 1) differ from dst[0] strides (1, 4)",
        1: "src[1] shape (1,) broadcasts to dst[1] shape (3,)",
        2: "pair 2 casts complex to real (stock warns per copy)",
        3: "dst[3] is not dense",
    }
    assert p.empty == [4]
    assert "fallback pair 3: dst[3] is not dense" in str(p)


def test_size1_dims_may_have_any_stride():
    base = torch.empty(3, 1, 4)
    dst = [base.as_strided((3, 1, 4), (4, 99, 1))]
    p = nd.explain(dst, [torch.randn(3, 1, 4)])
    assert p.fallback == [] and [g.indices for g in p.groups] == [[0]]


@pytest.mark.parametrize(
    "make, kind, text",
    [
        (lambda: ([torch.empty(2)], [torch.empty(3)]), "may_raise", "does not broadcast"),
        (lambda: ([torch.empty(1).expand(3)], [torch.empty(3)]), "may_raise", "internal overlap"),
        (lambda: ([torch.empty(2, device="meta")], [torch.empty(2)]), "meta", "meta"),
        (lambda: ([torch.empty(2).to_sparse()], [torch.empty(2).to_sparse()]), "layout", "layout torch.sparse_coo"),
        (lambda: ([torch.empty(3), torch.empty((), dtype=torch.bfloat16)], [torch.empty(3), torch.empty(())]),
         "order_dependent", "pair 1 converts a 0-dim float32 into bfloat16"),
        (lambda: ([torch.empty(2), torch.empty(2)._neg_view()], [torch.empty(2), torch.empty(2)]),
         "conj_neg", "dst[1] has a lazy conjugate or negative bit"),
    ],
)
def test_whole_call_goes_to_stock(make, kind, text):
    p = nd.explain(*make())
    assert p.stock_reason[0] == kind and text in p.stock_reason[1]
    assert "whole call -> stock" in str(p)


def test_overlap_between_destination_and_source_of_another_pair():
    x = torch.arange(10.0)
    p = nd.explain([x[0:5], x[5:10]], [x[3:8], torch.zeros(5)])
    assert p.stock_reason == ("aliasing", "src[0] overlaps dst[0]: kept as stock's sequential copy_ loop")
    p = nd.explain([x[0:5], x[5:10]], [torch.zeros(5), x[0:5]])
    assert p.stock_reason[0] == "aliasing" and "dst[0]" in p.stock_reason[1] and "src[1]" in p.stock_reason[1]


def test_sources_may_overlap_each_other():
    x = torch.arange(10.0)
    p = nd.explain([torch.empty(5), torch.empty(5)], [x[0:5], x[2:7]])
    assert p.stock_reason is None and p.fallback == []


def test_run_never_leaves_its_storage():
    # Two allocations that happen to be adjacent in memory must not become one flat view.
    big = torch.empty(8)
    a, b = big[:4], big[4:]
    p = nd.explain([a, b], [torch.randn(8)[:4], torch.randn(4)])
    assert p.runs == []  # sources are separate storages
    s = torch.randn(8)
    p = nd.explain([a, b], [s[:4], s[4:]])
    assert [r.indices for r in p.runs] == [[0, 1]]


def test_explain_checks_lists_like_stock():
    with pytest.raises(RuntimeError, match="Tensor list must have at least one tensor."):
        nd.explain([], [])
    with pytest.raises(RuntimeError, match="got 1 and 2"):
        nd.explain([torch.empty(1)], [torch.empty(1), torch.empty(1)])


# ---- the npu rules, driven on CPU through the capability table --------------------------------


def test_npu_before_cann_9_1_stages_the_fsdp_cast():
    with override({"cpu": npu_capability("8.0.RC3")}):
        dst, src = _fsdp_cast(10)
        p = nd.explain(dst, src)
        # No native fp32 -> bf16 kernel: one batched fp32 copy into scratch, one flat cast.
        assert p.groups == [] and p.fallback == []
        assert [(s.indices, s.adjacent, s.launches) for s in p.stages] == [(list(range(10)), True, 2)]
        assert p.launches == 2
        dst, src = _fsdp_cast(2)
        p = nd.explain(dst, src)  # staging 2 pairs issues no fewer launches than copying them
        assert p.stages == [] and p.fallback == [0, 1]
        assert p.reasons[0] == ("dtype", "dtype pair float32->bfloat16 not supported by the npu fast path")
        dst, src = _fsdp_cast(10, adjacent_src=True)
        assert nd.explain(dst, src).launches == 1  # one flat cast still beats N launches


@pytest.mark.parametrize("cann, cross_ok", [("9.0.0", False), ("9.1.RC1", False), ("9.1.0", True), ("10.0.RC2", True)])
def test_npu_cross_dtype_needs_the_cann_9_1_release(cann, cross_ok):
    with override({"cpu": npu_capability(cann)}):
        dst, src = _fsdp_cast(3)
        p = nd.explain(dst, src)
        assert p.fallback == [] and bool(p.groups) is cross_ok and bool(p.stages) is not cross_ok


def test_npu_cann_9_1_cross_dtype_groups_split_by_48():
    with override({"cpu": npu_capability("9.1.0")}):
        dst, src = _fsdp_cast(100)
        p = nd.explain(dst, src)
        assert [(len(g.indices), g.launches) for g in p.groups] == [(100, 3)]
        dst, src = _fsdp_cast(5, src_dtype=f64)
        p = nd.explain(dst, src)  # not one of the four native pairs: staged through fp64 scratch
        assert p.groups == [] and [(s.src_dtype, s.launches) for s in p.stages] == [(f64, 2)]


@pytest.mark.parametrize("cann, int64_ok", [("8.0.RC3", False), ("8.1.RC1", True), ("8.1.0", True), (None, False)])
def test_npu_int64_needs_cann_8_1(cann, int64_ok):
    with override({"cpu": npu_capability(cann)}):
        p = nd.explain([torch.empty(3, dtype=torch.int64), torch.empty(3, dtype=torch.int64)],
                       [torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)])
        assert (p.fallback == []) is int64_ok


def test_a_call_with_no_fast_pair_is_whole_stock_only_where_the_devices_own_op_batches():
    # The npu rules on CPU tensors: the CPU has no op of its own that batches lists
    # (device_batching.h), so each pair falls back with its own reason, one launch each.
    d = [torch.zeros(5, dtype=bf16), torch.zeros(4, dtype=torch.int8)]
    s = [torch.randn(5, dtype=f64), torch.randn(4)]
    with override({"cpu": npu_capability("8.0.RC3")}):
        p = nd.explain(d, s)
        assert p.stock_reason is None and p.fallback == [0, 1] and p.launches == 2
        assert [p.reasons[i][0] for i in (0, 1)] == ["dtype", "dtype"]
        want = [t.clone() for t in d]
        torch._foreach_copy_(want, s)
        with nd.NpuFastCopyMode() as mode:
            torch._foreach_copy_(d, s)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(d, want))
    assert mode.stats.fallback_reasons == {"dtype": 2}, mode.stats.report()


def test_no_capability_means_fallback_and_results_still_match():
    with override({"cpu": None}):
        dst = [torch.empty(3), torch.empty(4)]
        src = [torch.randn(3), torch.randn(4)]
        p = nd.explain(dst, src)
        assert p.fallback == [0, 1] and p.reasons[0][1] == "no fast path for device type cpu"
        with nd.NpuFastCopyMode() as m:
            torch._foreach_copy_(dst, src)
        assert torch.equal(dst[0], src[0]) and m.stats.fallback_reasons["no_capability"] == 2


def test_override_is_scoped_and_table_is_data():
    cap = Capability("test", frozenset({f32}), frozenset(), 7, "test")
    with override({"cpu": cap}):
        assert nd.capabilities.lookup("cpu") is cap
        # The planner reads the table: 15 fp32 pairs at 7 a launch.
        p = nd.explain([torch.zeros(2) for _ in range(15)], [torch.ones(2) for _ in range(15)])
        assert [(len(g.indices), g.launches) for g in p.groups] == [(15, 3)] and p.launches == 3
    assert nd.capabilities.lookup("cpu").name == "cpu"
    assert nd.capabilities.table()["npu"].max_tensors_per_launch == 48


@pytest.mark.parametrize("make, want", [
    (lambda: ([torch.zeros(4), torch.zeros(5)], [torch.ones(4), torch.ones(5)]), False),  # every pair fast
    (lambda: ([torch.zeros(4), torch.zeros(2, 3)], [torch.ones(4), torch.ones(3)]), True),  # a broadcast pair
    (lambda: (lambda b: ([b[0:4], b[2:6]], [torch.ones(4), torch.ones(4)]))(torch.zeros(6)), True),  # aliasing
], ids=["fast", "fallback_pair", "whole_stock"])
def test_explain_says_whether_strict_refuses_the_call(make, want):
    dsts, srcs = make()
    assert nd.explain(dsts, srcs).leaves_fast_path is want
    refused = False
    try:
        with nd.NpuFastCopyMode(strict=True):
            torch._foreach_copy_(dsts, srcs)
    except nd.FastCopyFallbackError:
        refused = True
    assert refused is want


_COPY_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]


def test_the_cpu_entry_is_the_kernels_pairs_and_cuda_takes_every_pair_the_rule_admits():
    # CUDA's dtypes are the rule's own (None: csrc/planner/classify_impl.h copy_dtype); the CPU
    # entry holds the pairs the CPU kernel copies as stock does (its self-check): each of those is
    # a foreach pair, every other pair a dtype fallback, complex -> real one by the rule.
    cuda = nd.capabilities.lookup_default("cuda")
    assert cuda.dtypes is None and cuda.cross_pairs is None
    cpu = nd.capabilities.lookup_default("cpu")
    kernel = set(_native.module().kernel_pairs())
    assert {(d, d) for d in cpu.dtypes} | set(cpu.cross_pairs) == kernel
    assert (torch.float32, torch.float32) in kernel and (torch.bool, torch.bool) not in kernel
    assert (torch.int32, torch.float32) not in kernel
    for s in _COPY_DTYPES:
        for d in _COPY_DTYPES:
            p = nd.explain([torch.zeros(3, dtype=d)], [torch.ones(3, dtype=s)])
            if (s, d) in kernel:
                assert [g.indices for g in p.groups] == [[0]] and p.fallback == [], (s, d)
            else:
                assert p.groups == [] and p.reasons[0][0] == "dtype", (s, d)
