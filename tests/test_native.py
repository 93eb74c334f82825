"""The C++ planner and executors (csrc/, npu_dispatch/_native.py) against stock.

Skipped where the library cannot be built (no compiler); ``NPU_DISPATCH_REQUIRE_NATIVE=1`` turns
that skip into a failure, for CI machines that must build it.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing._internal.two_tensor import TwoTensor

import npu_dispatch as nd
from npu_dispatch import _native, capabilities
from npu_dispatch._native_plan import native_plan
from cases import DTYPES, assert_same, bits, build, cases, direct_copy, mode_copy, op_copy, run, stock_copy

if not _native.available():
    if os.environ.get("NPU_DISPATCH_REQUIRE_NATIVE") == "1":
        pytest.fail(f"native library required: {_native.status()[1]}", pytrace=False)
    pytest.skip(f"native library not built: {_native.status()[1]}", allow_module_level=True)

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
CONVERSIONS = [(f32, bf16), (bf16, f32), (f32, f16), (f16, f32)]
X86 = platform.machine() in ("x86_64", "AMD64")


def passes() -> int:
    return _native.info()["kernel_passes"]


def _words(dtype) -> torch.dtype:
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[torch.empty(0, dtype=dtype).element_size()]


def from_bits(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    w = _words(dtype)
    width = 8 * torch.empty(0, dtype=w).element_size()
    signed = [v - (1 << width) if v >= 1 << (width - 1) else v for v in values]
    return torch.tensor(signed, dtype=w).view(dtype)


F32_SPECIALS = [
    0x7FC00000, 0xFFC00000, 0xFFC12345, 0x7F800001, 0xFF800001, 0x7FA00000, 0x7FFFFFFF, 0x7F800000,
    0xFF800000, 0x80000000, 0x00000001, 0x807FFFFF, 0x3F808000, 0x3F818000, 0x477FEFFF, 0x477FF000,
    0x33000000, 0x33000001, 0x387FC000, 0x3F800000,
]
H16_SPECIALS = [0x7C01, 0xFC01, 0x7D01, 0xFE00, 0x7FFF, 0x7C00, 0x8000, 0x0001, 0x83FF, 0x7F81, 0xFFC1, 0x3C00]


def special_source(dtype: torch.dtype, n: int, shift: int) -> torch.Tensor:
    pats = F32_SPECIALS if dtype == f32 else H16_SPECIALS
    return from_bits([pats[(k + shift) % len(pats)] for k in range(n)], dtype)


# ---- the library is there and is the one doing the work ---------------------------------------


def test_library_loaded_and_checked_against_stock():
    built, reason = _native.status()
    assert built, reason
    if os.environ.get("CI"):
        # .ci/run installs with --no-build-isolation: the extension that install built serves.
        assert "built at install" in reason, reason
    sc = _native.self_check_result()
    assert set(sc) == {"f32->bf16", "bf16->f32", "f32->f16", "f16->f32"}
    if X86 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert all(v["enabled"] for v in sc.values()), sc


def test_cpu_copies_run_in_the_cpp_kernel():
    before = passes()
    dsts = [torch.empty(n) for n in (3, 70, 5)]
    nd.foreach_copy_(dsts, [torch.ones(3), torch.ones(70), torch.ones(5)])
    assert passes() == before + 1  # one pass for all three pairs
    assert all(torch.equal(d, torch.ones_like(d)) for d in dsts)


# ---- bitwise parity with stock ----------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(cases(max_len=300))
def test_random_cases_match_stock(case):
    stock = run(case, stock_copy)
    assert_same(stock, run(case, direct_copy))
    assert_same(stock, run(case, op_copy))


@st.composite
def long_lists(draw):
    """1-D pairs of 0..300 elements, any dtype pair, specials at every position over the draws."""
    n = draw(st.integers(1, 24))
    sdt = draw(st.sampled_from(DTYPES))
    ddt = sdt if draw(st.booleans()) else draw(st.sampled_from(DTYPES))
    lengths = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    return sdt, ddt, lengths, draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, 2**31 - 1))


def _long_case(sdt, ddt, lengths, dst_adj, src_adj, seed):
    g = torch.Generator().manual_seed(seed)

    def fill(n, dtype):
        if dtype in (f32, f16, bf16) and n:
            t = special_source(dtype, n, int(torch.randint(0, 1000, (1,), generator=g)))
            noise = torch.rand(n, generator=g) < 0.5
            rnd = torch.randn(n, generator=g).to(dtype)
            return torch.where(noise, rnd, t)
        if dtype == torch.bool:
            return torch.randint(0, 2, (n,), generator=g).bool()
        if dtype.is_complex:
            return torch.randn(n, generator=g, dtype=dtype)
        if dtype.is_floating_point:
            return torch.randn(n, generator=g, dtype=dtype) * 1e3
        return torch.randint(-100, 100, (n,), generator=g).to(dtype)

    def make(kind):
        dtype = sdt if kind == "src" else ddt
        adjacent = src_adj if kind == "src" else dst_adj
        if adjacent:
            buf = torch.cat([fill(n, dtype) for n in lengths]) if sum(lengths) else torch.empty(0, dtype=dtype)
            return list(torch.split(buf, lengths))
        return [fill(n, dtype) for n in lengths]

    return make("dst"), make("src")


@settings(max_examples=150, deadline=None)
@given(long_lists())
def test_lengths_up_to_300_all_dtype_pairs_match_stock(spec):
    d0, s0 = _long_case(*spec)
    d1, s1 = _long_case(*spec)
    with torch.no_grad():
        torch._foreach_copy_(d0, s0)
        nd.foreach_copy_(d1, s1)
    for a, b in zip(d0, d1):
        assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("sdt,ddt", CONVERSIONS)
@pytest.mark.parametrize("adjacent", [False, True])
def test_specials_at_every_position_of_every_length(sdt, ddt, adjacent):
    lengths = list(range(1, 101))
    for shift in range(3):
        srcs = [special_source(sdt, n, shift + n) for n in lengths]
        if adjacent:  # one coalesced run of 100 pairs: each pair still gets its own tail
            srcs = list(torch.split(torch.cat(srcs), lengths))
        want = [torch.empty(n, dtype=ddt) for n in lengths]
        torch._foreach_copy_(want, srcs)
        got = list(torch.split(torch.empty(sum(lengths), dtype=ddt), lengths)) if adjacent else [
            torch.empty(n, dtype=ddt) for n in lengths
        ]
        nd.foreach_copy_(got, srcs)
        for n, a, b in zip(lengths, want, got):
            assert torch.equal(bits(a), bits(b)), f"length {n}, shift {shift}"


@pytest.mark.parametrize("sdt", [bf16, f16])
def test_widening_casts_into_every_position_of_a_cache_line(sdt):
    """Each destination a view of one fp32 buffer starting at element offset 0..16 of a 64-byte
    line, with a gap to the next (no coalescing): the AVX-512 widening stores whole lines from the
    first line boundary on. Bits as stock's and nothing written outside the views."""
    sentinel = torch.tensor([0x7FC12345], dtype=torch.int32).view(f32)
    lengths = list(range(1, 81))
    for shift in range(17):
        srcs = [special_source(sdt, n, shift + n) for n in lengths]
        want = [torch.empty(n, dtype=f32) for n in lengths]
        torch._foreach_copy_(want, srcs)
        # Views start at shift, then every (n + 5) elements: offsets mod 16 take every value.
        starts, pos = [], shift
        for n in lengths:
            starts.append(pos)
            pos += n + 5
        buf = sentinel.repeat(pos + 16)
        assert buf.data_ptr() % 64 == 0
        got = [buf[a:a + n] for a, n in zip(starts, lengths)]
        with nd.NpuFastCopyMode() as mode:
            nd.foreach_copy_(got, srcs)
        assert mode.stats.fast_path_calls == 1 and mode.stats.total_fallback_calls == 0, mode.stats.as_dict()
        for n, a, b in zip(lengths, want, got):
            assert torch.equal(bits(a), bits(b)), f"length {n}, first element at {shift}"
        outside = torch.ones(buf.numel(), dtype=torch.bool)
        for a, n in zip(starts, lengths):
            outside[a:a + n] = False
        assert torch.equal(bits(buf[outside]), bits(sentinel.expand(int(outside.sum())))), f"shift {shift}"


@pytest.mark.parametrize("sdt", [f16, bf16])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_16_bit_pattern_long_and_short(sdt, threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        allbits = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(sdt)
        # One long tensor: above ATen's grain, stock copies it in per-thread chunks.
        for src in (allbits, allbits.repeat(2)[: 2 * 32768 + 37]):
            want = torch.empty(src.shape, dtype=f32)
            want.copy_(src)
            got = torch.empty(src.shape, dtype=f32)
            nd.foreach_copy_([got], [src])
            assert torch.equal(bits(want), bits(got))
        # Many short tensors: every pattern in a scalar tail somewhere.
        lengths, total = [], 0
        while total < 65536:
            lengths.append(min(1 + len(lengths) % 17, 65536 - total))
            total += lengths[-1]
        pieces = list(torch.split(allbits, lengths))
        want = [torch.empty(p.shape, dtype=f32) for p in pieces]
        torch._foreach_copy_(want, pieces)
        got = [torch.empty(p.shape, dtype=f32) for p in pieces]
        nd.foreach_copy_(got, pieces)
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(want, got))
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("ddt", [f16, bf16])
@pytest.mark.parametrize("threads", [1, 2])
def test_large_fp32_sources_with_nans_near_chunk_ends(ddt, threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = 3 * 32768 + 11
        src = special_source(f32, n, 0)
        want = torch.empty(n, dtype=ddt)
        want.copy_(src)
        got = torch.empty(n, dtype=ddt)
        nd.foreach_copy_([got], [src])
        assert torch.equal(bits(want), bits(got))
    finally:
        torch.set_num_threads(old)


def test_size_zero_pairs_mixed_with_large_ones():
    lengths = [0, 200_000, 0, 3, 0, 70_000, 1]
    srcs = [torch.randn(n) for n in lengths]
    for ddt in (f32, bf16, f16, torch.float64):
        want = [torch.empty(n, dtype=ddt) for n in lengths]
        torch._foreach_copy_(want, srcs)
        got = [torch.empty(n, dtype=ddt) for n in lengths]
        nd.foreach_copy_(got, srcs)
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(want, got))


@pytest.mark.parametrize("layout", ["transposed", "channels_last", "strided"])
def test_non_contiguous_layouts_match_stock(layout):
    def make():
        g = torch.Generator().manual_seed(1)
        base = [torch.randn(2, 3, 5, 4, generator=g) for _ in range(6)]
        if layout == "transposed":
            dsts = [torch.empty(2, 3, 4, 5, dtype=bf16).transpose(-1, -2) for _ in base]
            srcs = [b.transpose(-1, -2).contiguous().transpose(-1, -2) for b in base]
        elif layout == "channels_last":
            dsts = [torch.empty(2, 3, 5, 4, dtype=f16).contiguous(memory_format=torch.channels_last) for _ in base]
            srcs = [b.contiguous(memory_format=torch.channels_last) for b in base]
        else:
            dsts = [torch.empty(2, 3, 5, 8, dtype=bf16)[..., ::2] for _ in base]
            srcs = base
        return dsts, srcs

    d0, s0 = make()
    torch._foreach_copy_(d0, s0)
    d1, s1 = make()
    nd.foreach_copy_(d1, s1)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(d0, d1))


def test_aliasing_at_other_indices_keeps_the_sequential_result():
    def make():
        buf = torch.arange(12, dtype=f32)
        return [buf[0:4], buf[4:8], buf[8:12]], [torch.full((4,), 7.0), buf[0:4], buf[4:8]]

    d0, s0 = make()
    torch._foreach_copy_(d0, s0)
    d1, s1 = make()
    nd.foreach_copy_(d1, s1)
    assert all(torch.equal(a, b) for a, b in zip(d0, d1))
    assert native_plan(d1, s1).stock_reason[0] == "aliasing"


def test_version_counters_and_inference_mode_match_stock():
    for grad_mode in (True, False):
        with torch.set_grad_enabled(grad_mode):
            a = [torch.zeros(3), torch.zeros(5, dtype=bf16)]
            b = [torch.zeros(3), torch.zeros(5, dtype=bf16)]
            s = [torch.ones(3), torch.ones(5)]
            torch._foreach_copy_(a, s)
            nd.foreach_copy_(b, s)
            op_copy(b, s)
            torch._foreach_copy_(a, s)
            assert [t._version for t in a] == [t._version for t in b] == [2, 2]
    with torch.inference_mode():
        x = torch.zeros(4)
        nd.foreach_copy_([x], [torch.ones(4)])
        assert torch.equal(x, torch.ones(4))


# ---- explain() shows what runs ----------------------------------------------------------------


def _planned_counts(p):
    """Per path (tensors, launches) and the reasons, as the stats of the call would count them."""
    counts, reasons = {}, {}
    if p.stock_reason is not None:  # every pair of the call, for its one reason
        return {"stock": (p.n, p.n)}, {p.stock_reason[0]: p.n}
    for i in p.fallback:
        reasons[p.reasons[i][0]] = reasons.get(p.reasons[i][0], 0) + 1
    if p.runs:
        counts["coalesced"] = (sum(len(r.indices) for r in p.runs), len(p.runs))
    if p.groups:
        counts["foreach"] = (sum(len(g.indices) for g in p.groups), sum(g.launches for g in p.groups))
    if p.fallback:
        counts["fallback"] = (len(p.fallback), p.fallback_launches)
    if p.empty:
        counts["empty"] = (len(p.empty), 0)
    return counts, reasons


def _counted(stats):
    d = stats.as_dict()
    return ({k: (v["tensors"], v["launches"]) for k, v in d["paths"].items() if v["calls"]},
            d["fallback_reasons"])


@settings(max_examples=80, deadline=None)
@given(cases(max_len=150))
def test_explain_shows_the_plan_the_mode_runs(case):
    dsts, srcs, _ = build(case)
    plan = nd.explain(dsts, srcs)
    assert str(plan).startswith(f"plan for {len(dsts)} pair(s)")
    mode = nd.NpuFastCopyMode()
    with mode:
        try:
            torch._foreach_copy_(dsts, srcs)
        except RuntimeError:
            assert plan.stock_reason is not None  # only a whole-stock call raises midway
            return
    assert _counted(mode.stats) == _planned_counts(plan)


@pytest.mark.parametrize("cann", ["8.0.RC3", "8.1.RC1", "9.1.0"])
def test_npu_rules_are_data_the_planner_reads(cann):
    # The npu capability entry, put in place of the CPU one: the planner reads only the table.
    cap = capabilities.npu_capability(cann)
    n = 100
    same = ([torch.empty(4) for _ in range(n)], [torch.randn(4) for _ in range(n)])
    cast = ([torch.empty(4, dtype=bf16) for _ in range(n)], [torch.randn(4) for _ in range(n)])
    wide = ([torch.empty(4, dtype=torch.int64)], [torch.ones(4, dtype=torch.int64)])
    with capabilities.override({"cpu": cap}):
        p = nd.explain(*same)
        assert [len(g.indices) for g in p.groups] == [n] and p.groups[0].launches == -(-n // 48)
        p = nd.explain(*cast)
        if cann == "9.1.0":
            assert not p.fallback and p.groups[0].launches == -(-n // 48)
        else:  # staged: batched copies in and out of scratch around one cast
            assert not p.fallback and not p.groups and p.launches == 2 * -(-n // 48) + 1
        p = nd.explain(*wide)
        assert bool(p.fallback) == (cann == "8.0.RC3")


def test_a_device_without_a_capability_falls_back_until_the_override_ends():
    dsts = [torch.empty(4, dtype=bf16), torch.empty(3)]
    srcs = [torch.randn(4), torch.randn(3)]
    with capabilities.override({"cpu": None}):
        p = native_plan(dsts, srcs)
        assert p.fallback == [0, 1] and p.reasons[0][0] == "no_capability"
    assert not native_plan(dsts, srcs).fallback


def test_whole_call_reasons():
    x = torch.zeros(4)
    cases_ = [
        ([TwoTensor(torch.zeros(3), torch.zeros(3))], [torch.ones(3)], "subclass"),
        ([torch.zeros(3), torch.zeros(2, 2).to_sparse()], [torch.ones(3), torch.ones(2, 2)], "layout"),
        ([torch.zeros(3), torch.zeros(3, device="meta")], [torch.ones(3), torch.ones(3, device="meta")], "meta"),
        ([torch.zeros(3), torch.zeros(3)], [torch.ones(3), torch.ones(4)], "may_raise"),
        ([torch.zeros(1).expand(4)], [torch.ones(4)], "may_raise"),
        ([x[:3], x[1:]], [torch.ones(3), torch.ones(3)], "aliasing"),
        ([x[:2], torch.zeros(2)], [torch.ones(2), x[1:3]], "aliasing"),
        ([torch.zeros(2), torch.zeros((), dtype=f16)], [torch.ones(2), torch.ones((), dtype=torch.float64)],
         "order_dependent"),
        ([torch.zeros(2), torch.zeros(2, dtype=torch.complex64).conj()], [torch.ones(2), torch.ones(2)], "conj_neg"),
    ]
    for dsts, srcs, kind in cases_:
        p = native_plan(dsts, srcs)
        assert p.stock_reason is not None and p.stock_reason[0] == kind, (p, kind)
        assert "whole call -> stock" in str(p)


@pytest.mark.parametrize("entry", [direct_copy, op_copy, mode_copy], ids=lambda f: f.__name__)
def test_zero_dim_nan_cast_after_an_empty_cast_writes_the_defined_nan(entry):
    # Stock writes 0xffff here and 0x7fc0 for the 0-dim copy alone: its bits follow stale stack
    # memory (docs/stock_quirks.md). The whole call runs as stock's copy_ loop, which writes
    # c10::BFloat16's 0x7fc0 for that NaN whatever ran before.
    def make():
        nan = torch.tensor(0x7FC00000, dtype=torch.int32).view(f32)
        return [torch.zeros(0, dtype=bf16), torch.zeros((), dtype=bf16)], [torch.zeros(0), nan]

    d, s = make()
    torch._foreach_copy_(d, s)
    assert int(d[1].view(torch.int16)) & 0xFFFF in (0x7FC0, 0xFFFF)  # stock: either
    d, s = make()
    entry(d, s)
    assert int(d[1].view(torch.int16)) & 0xFFFF == 0x7FC0


# ---- strict, verify, stats, registration ------------------------------------------------------


def test_verify_catches_a_corrupted_native_result(monkeypatch):
    real = _native.planned_op()

    def corrupt(dsts, srcs, nb, strict, bump):
        out = real(dsts, srcs, nb, strict, bump)
        dsts[0].view(torch.int32)[0] ^= 1
        return out

    monkeypatch.setattr(_native, "planned_op", lambda: corrupt)
    with pytest.raises(nd.FastCopyMismatchError, match=r"dst\[0\]"):
        with nd.NpuFastCopyMode(verify=True):
            torch._foreach_copy_([torch.zeros(4)], [torch.ones(4)])


def test_stats_count_each_path_and_reason():
    buf = torch.empty(10, dtype=bf16)
    dsts = list(torch.split(buf, [4, 6])) + [torch.empty(3), torch.empty(2, 2).t(), torch.empty(0)]
    srcs = list(torch.randn(10).split([4, 6])) + [torch.randn(3), torch.randn(2, 2), torch.randn(0)]
    mode = nd.NpuFastCopyMode()
    with mode:
        torch._foreach_copy_(dsts, srcs)
    d = mode.stats.as_dict()
    assert {k: v["tensors"] for k, v in d["paths"].items() if v["calls"]} == {
        "coalesced": 2, "foreach": 1, "fallback": 1, "empty": 1}
    assert d["fallback_reasons"] == {"strides": 1}
    assert d["paths"]["coalesced"]["bytes"] == 20 and d["paths"]["fallback"]["bytes"] == 16


def test_cpp_kernels_of_the_public_ops_count_in_global_stats():
    nd.global_stats().reset()
    before = passes()
    x = torch.empty(6)
    op_copy(list(torch.split(x, 3)), list(torch.split(torch.ones(6), 3)))
    out = torch.zeros(20, dtype=bf16)
    inp, o = torch.ops.npu_dispatch.all_gather_copy_in.default([torch.ones(4), torch.ones(6)], out, [4, 6], 10, 1)
    assert passes() == before + 2
    assert torch.equal(x, torch.ones(6)) and torch.equal(out[10:], torch.ones(10, dtype=bf16))
    assert o is out and inp.data_ptr() == out.data_ptr() + 20 and out._version == 2
    stats = nd.global_stats().as_dict()
    assert stats["ops"]["npu_dispatch.foreach_copy_"]["calls"] == 1
    assert stats["ops"]["npu_dispatch.all_gather_copy_in"]["fast_calls"] == 1
    assert stats["paths"]["coalesced"]["tensors"] == 2 and stats["paths"]["foreach"]["tensors"] == 2


def test_direct_op_leaves_grad_requiring_copies_to_autograd():
    leaf = torch.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        torch._foreach_copy_([torch.zeros(3, requires_grad=True)], [torch.ones(3)])
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        nd.foreach_copy_([leaf], [torch.ones(3)])
    before = passes()
    d = torch.zeros(3, requires_grad=True) * 1
    nd.foreach_copy_([d], [torch.ones(3, requires_grad=True)])
    assert passes() == before and d.grad_fn is not None  # recorded by stock's autograd
    with torch.no_grad():
        nd.foreach_copy_([leaf], [torch.ones(3)])
    assert passes() == before + 1 and torch.equal(leaf.detach(), torch.ones(3))


@pytest.mark.parametrize("make", [
    lambda: ([torch.empty(3, device="meta")], [torch.empty(3, device="meta")]),
    lambda: ([torch.zeros(3), torch.empty(3, device="meta")], [torch.ones(3), torch.ones(3)]),
    lambda: ([torch.zeros(3), torch.zeros(3)], [torch.ones(3), torch.empty(3, device="meta")]),
])
def test_meta_tensors_take_the_stock_path(make):
    outcomes = []
    for fn in (torch._foreach_copy_, nd.foreach_copy_, torch.ops.npu_dispatch.foreach_copy_):
        d, s = make()
        try:
            fn(d, s)
            err = None
        except Exception as e:
            err = (type(e), str(e))
        outcomes.append((err, [None if t.is_meta else (bits(t), t._version) for t in d]))
    stock = outcomes[0]
    for ours in outcomes[1:]:
        assert ours[0] == stock[0]
        assert len(ours[1]) == len(stock[1])
        for a, b in zip(stock[1], ours[1]):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.equal(a[0], b[0]) and a[1] == b[1]
    assert native_plan(*make()).stock_reason[0] == "meta"


def test_list_errors_are_stocks():
    one, two = [torch.zeros(1)], [torch.zeros(1), torch.zeros(1)]
    for dsts, srcs in [([], []), (one, []), ([], one), (one, two), (two, one)]:
        with pytest.raises(RuntimeError) as stock:
            torch._foreach_copy_(dsts, srcs)
        with pytest.raises(RuntimeError) as native:
            _native.planned_op()(dsts, srcs, False, False, True)
        assert str(native.value).splitlines()[0] == str(stock.value)


# ---- build ------------------------------------------------------------------------------------


def test_without_the_native_library_every_copy_is_stocks_and_counted_as_no_native():
    code = textwrap.dedent("""
        import torch, npu_dispatch as nd
        from npu_dispatch import _native
        built, reason = _native.status()
        x, y = torch.empty(4), torch.empty(3, dtype=torch.bfloat16)
        nd.foreach_copy_([x], [torch.ones(4)])
        assert torch.equal(x, torch.ones(4)) and x._version == 1
        src = torch.randn(3)
        with nd.NpuFastCopyMode() as mode:
            torch._foreach_copy_([y], [src])
        assert torch.equal(y, src.bfloat16()) and y._version == 1
        built, reason = _native.status()
        assert not built and "NPU_DISPATCH_NATIVE=0" in reason, reason
        stats = mode.stats.as_dict()
        assert stats["fallback_reasons"] == {"no_native": 1}, stats
        assert stats["ops"]["aten._foreach_copy_"]["fallback_calls"] == 1
        assert nd.global_stats().fallback_reasons["no_native"] == 1
        with nd.NpuFastCopyMode(strict=True) as smode:  # explain runs nothing a mode or counter sees
            assert nd.explain([x], [x]).stock_reason[0] == "no_native"
        assert smode.stats.as_dict()["ops"] == {}, smode.stats.as_dict()
        with nd.NpuFastCopyMode() as fmode:  # the functional variant: stock's outputs, counted
            outs = torch.ops.aten._foreach_copy.default([torch.zeros(2, 3).t()], [torch.ones(3, 2)])
        assert outs[0].stride() == (1, 3) and torch.equal(outs[0], torch.ones(3, 2))
        assert fmode.stats.as_dict()["fallback_reasons"] == {"no_native": 1}, fmode.stats.as_dict()
        p = nd.explain([x, x], [x, x])
        assert p.stock_reason[0] == "no_native" and p.launches == 2
        for dsts, srcs in [([], []), ([x], [x, x])]:  # stock's list-level errors, word for word
            try:
                torch._foreach_copy_(dsts, srcs)
            except RuntimeError as e:
                want = str(e)
            try:
                nd.explain(dsts, srcs)
            except RuntimeError as e:
                assert str(e) == want, (str(e), want)
            else:
                raise AssertionError("explain did not raise")
        try:
            with nd.NpuFastCopyMode(strict=True):
                torch._foreach_copy_([x], [torch.ones(4)])
        except nd.FastCopyFallbackError as e:
            assert "no_native" in str(e)
        else:
            raise AssertionError("strict did not raise")
        # Each call counted once, under the op called, though the library's ops and FSDP's call
        # aten's owned ops beneath.
        import torch.distributed.fsdp._fully_shard._fsdp_collectives
        g = torch.randn(4, 30)
        outs = lambda: [torch.zeros(4, 10), torch.zeros(4, 20)]
        with nd.NpuFastCopyMode() as mode:
            torch.split_with_sizes_copy(g, [10, 20], 1, out=outs())
            torch.ops.fsdp.split_with_sizes_copy(g, [10, 20], dim=1, out=outs())
            nd.split_with_sizes_copy(g, [10, 20], 1, out=outs())
            nd.foreach_copy_([torch.zeros(3)], [torch.ones(3)])
        calls = {k: (v["calls"], v["fallback_calls"]) for k, v in mode.stats.as_dict()["ops"].items()}
        assert calls == {"aten.split_with_sizes_copy.out": (1, 1), "fsdp.split_with_sizes_copy": (1, 1),
                         "npu_dispatch.split_with_sizes_copy": (1, 1), "npu_dispatch.foreach_copy_": (1, 1)}, calls
        # Pairs as every route counts them: the first tensor list (here out), wherever it is passed.
        pairs = {k: v["paths"]["stock"]["pairs"] for k, v in mode.stats.as_dict()["ops"].items()}
        assert pairs == {"aten.split_with_sizes_copy.out": 2, "fsdp.split_with_sizes_copy": 2,
                         "npu_dispatch.split_with_sizes_copy": 2, "npu_dispatch.foreach_copy_": 1}, pairs
    """)
    env = dict(os.environ, NPU_DISPATCH_NATIVE="0")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)


@pytest.mark.skipif(shutil.which("objdump") is None or not X86, reason="needs objdump on x86")
def test_wide_vector_code_stays_in_the_per_isa_namespaces():
    # Inline functions compiled after an ISA switch could be picked by the linker for callers on
    # CPUs without that ISA; every function using 256/512-bit registers must be ours.
    so = [_native.module().__file__]
    dis = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", so[0]], capture_output=True, text=True).stdout
    fn, offenders = None, set()
    for line in dis.splitlines():
        if line.endswith(">:"):
            fn = line
        elif fn and ("%zmm" in line or "%ymm" in line) and "npu_dispatch_avx" not in fn:
            offenders.add(fn)
    assert not offenders, sorted(offenders)[:5]


def test_the_boundary_names_come_from_the_cpp_enums():
    names = _native.names()
    # Report order, fast and off-fast paths, as C++ defines them (CallResult).
    assert nd.stats.paths() == names["paths"]
    assert set(names["fast_paths"]) | set(names["off_fast_paths"]) < set(names["paths"])
    assert not set(names["fast_paths"]) & set(names["off_fast_paths"])
    # Every reason a plan or a call reports is a C++ kind, by name.
    d = [torch.zeros(3), torch.zeros(4, 2)[:, 0]]
    s = [torch.ones(3), torch.ones(4)]
    with nd.NpuFastCopyMode() as m:
        torch._foreach_copy_(d, s)
    assert set(m.stats.fallback_reasons) == {"not_dense"} <= set(names["kinds"])
    assert set(m.stats.as_dict()["ops"]) == {"aten._foreach_copy_"} <= set(names["counted_ops"])
    assert nd.explain(d, s).reasons[1][0] == "not_dense"
    # The counted ops are the op table's rows (csrc/dispatch/owned_ops.h), in order.
    from npu_dispatch import _op_table

    assert names["counted_ops"] == tuple(row.counted for row in _op_table.rows())
    # The capability C++ plans with carries the Python Capability's fields by name.
    native = _native.module().Capability()
    fields = {f.name for f in dataclasses.fields(nd.capabilities.Capability)}
    for field in ("whole_list_only", "host_pass", "batched_transfers", "batched_keeps_versions", "stage_bytes"):
        assert field in fields and hasattr(native, field), field
