"""The one-pass plan (csrc/planner/one_pass.h): one pass for plain contiguous CPU lists, else the planner.

Every test checks both sides of the one-pass plan's contract against stock: where it takes a call the
result is stock's bit for bit (versions included) and the counts are the planner's; where it
refuses, nothing has been written and the planner serves the call.
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import weakref

import pytest
import torch
from hypothesis import given, settings

import npu_dispatch as nd
from npu_dispatch import _native
from cases import (STOCK_EITHER, Case, Pair, assert_same, assert_stock_error, bits, build, direct_copy, one_pass_calls,
                   one_pass_cases, mode_copy, mode_paths, op_copy, plan_paths, run, stock_copy, storage_bytes)

if not _native.available():
    if os.environ.get("NPU_DISPATCH_REQUIRE_NATIVE") == "1":
        pytest.fail(f"native library required: {_native.status()[1]}", pytrace=False)
    pytest.skip(f"native library not built: {_native.status()[1]}", allow_module_level=True)

f32, f16, bf16, i32, f64 = torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.float64


ENTRIES = [direct_copy, op_copy, mode_copy]


@pytest.fixture(autouse=True, scope="module")
def _installed():
    # The first NpuFastCopyMode() of a process installs the kernels and checks a live call (one
    # more one-pass call): made here, before any test counts calls.
    nd.NpuFastCopyMode()


def case(pairs, dst_adjacent=False, src_adjacent=False, alias=(), seed=7) -> Case:
    return Case(tuple(pairs), dst_adjacent, src_adjacent, tuple(alias), seed)


def contiguous(shape, src, dst) -> Pair:
    return Pair(shape, src, dst, "contiguous", "contiguous")


# Calls the one-pass plan must take: separate allocations, split views (one run), casts with NaN payloads
# and -0.0 (cases.py fills specials), fp16 -> fp32 (FBGEMM's per-pair tails), empties mixed in.
TAKEN = {
    "separate_f32": case([contiguous((n,), f32, f32) for n in (64, 300, 5, 1024)]),
    "adjacent_bf16": case([contiguous((n,), bf16, bf16) for n in (7, 64, 129)], True, True),
    "cast_f32_bf16": case([contiguous((3, n), f32, bf16) for n in (1, 8, 17, 33)]),
    "cast_bf16_f32_adjacent": case([contiguous((n,), bf16, f32) for n in (9, 16, 100)], True, True),
    "f16_to_f32_per_pair_tails": case([contiguous((n,), f16, f32) for n in (7, 8, 9, 70)], True, True),
    "f32_to_f16": case([contiguous((n,), f32, f16) for n in (3, 40)], True, True),
    "empties_between": case([contiguous((4,), f32, f32), contiguous((0,), f32, f32), contiguous((5,), f32, f32)], True, True),
    "two_dtype_groups": case([contiguous((4,), f32, f32), contiguous((6,), i32, i32), contiguous((4,), f32, bf16)]),
    "0dim_same_dtype": case([contiguous((), f64, f64), contiguous((2,), f64, f64)]),
}


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", sorted(TAKEN))
def test_plain_lists_take_the_one_pass_plan_and_match_stock(name, entry):
    before = one_pass_calls()
    assert_same(run(TAKEN[name], stock_copy), run(TAKEN[name], entry))
    assert one_pass_calls() == before + 1


def _inference_src():
    with torch.inference_mode():
        return torch.ones(4)


def _two_storages_side_by_side():
    # Two storages over one buffer: adjacent in memory, yet no run crosses storages
    # (csrc/planner/runs.h); the sources are one run's worth of adjacent views.
    buf = bytearray(64)
    a = torch.frombuffer(buf, dtype=torch.float32, count=4)
    b = torch.frombuffer(buf, dtype=torch.float32, count=4, offset=16)
    return [a, b], list(torch.arange(8.0).split(4))


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "dispatched"])
def test_adjacent_pairs_in_two_storages_are_two_singles_in_both_drivers(direct):
    dsts, srcs = _two_storages_side_by_side()
    want = [d.clone() for d in dsts]
    stock_copy(want, srcs)
    before = one_pass_calls()
    paths, reasons = mode_paths(_two_storages_side_by_side, direct=direct)
    assert one_pass_calls() == before + 1
    assert paths == plan_paths(_two_storages_side_by_side)[0]
    assert paths["coalesced"]["tensors"] == 0 and (paths["foreach"]["tensors"], paths["foreach"]["bytes"]) == (2, 32)
    assert reasons == {}
    direct_copy(dsts, srcs)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(dsts, want))


# Inference tensors as the rule takes them (csrc/planner/classify.h): an inference source is read as
# any other; inside inference_mode an inference destination is written too (no version to move).
# Builders run inside inference_mode when their name says so.
INFERENCE = {
    "inference_src": lambda: ([torch.zeros(4), torch.zeros(3)], [_inference_src(), torch.ones(3)]),
    "inside_inference_dst": lambda: ([torch.zeros(4), torch.zeros(5)], [torch.ones(4), torch.full((5,), -0.0)]),
    "inside_normal_dst_inference_src": lambda: ([_normal_zeros(4)], [torch.ones(4)]),
}


def _normal_zeros(n):
    with torch.inference_mode(False):
        return torch.zeros(n)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", sorted(INFERENCE))
def test_inference_tensors_take_the_one_pass_plan_as_stock_allows(name, entry):
    inside = name.startswith("inside")

    def outcome(fn):
        with torch.inference_mode(inside):
            dsts, srcs = INFERENCE[name]()
            fn(dsts, srcs)
        return [bits(d).tolist() for d in dsts], [None if d.is_inference() else d._version for d in dsts]

    want = outcome(stock_copy)
    before = one_pass_calls()
    assert outcome(entry) == want
    assert one_pass_calls() == before + 1


# Calls the one-pass plan must refuse (builders return fresh (dsts, srcs) each time).
REFUSED = {
    "src_is_a_dst": lambda: (lambda d: (d, [torch.ones(3), d[0]]))([torch.zeros(3), torch.zeros(3)]),
    "same_dst_twice": lambda: (lambda x: ([x, x], [torch.ones(3), torch.full((3,), 2.0)]))(torch.zeros(3)),
    "overlapping_dst_views": lambda: (lambda b: ([b[0:4], b[2:6]], [torch.ones(4), torch.full((4,), 2.0)]))(torch.zeros(6)),
    "src_overlaps_own_dst": lambda: (lambda b: ([b[0:4]], [b[1:5]]))(torch.arange(6.0)),
    # srcs[1] is dsts[0], met after a source at a higher address: the comparison seeks back.
    "src_is_a_dst_out_of_order": lambda: (lambda b: ([b[0:4], b[10:14], b[30:34]], [b[20:24], b[0:4], b[40:44]]))(
        torch.arange(48.0)),
    "broadcast_src": lambda: ([torch.zeros(2, 3)], [torch.ones(3)]),
    "transposed_dst": lambda: ([torch.zeros(3, 2).t()], [torch.ones(2, 3)]),
    "conj_src": lambda: ([torch.zeros(2, dtype=torch.complex64)], [torch.ones(2, dtype=torch.complex64).conj()]),
    "0dim_cast": lambda: ([torch.zeros((), dtype=bf16)], [torch.tensor(float("nan"))]),
    "int_to_float": lambda: ([torch.zeros(3)], [torch.arange(3, dtype=i32)]),
    "shape_mismatch_error": lambda: ([torch.zeros(3), torch.zeros(2)], [torch.ones(3), torch.ones(5)]),
}


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_other_lists_are_refused_and_still_match_stock(name, entry):
    def outcome(fn):
        dsts, srcs = REFUSED[name]()
        try:
            fn(dsts, srcs)
            err = None
        except Exception as e:
            err = (type(e), str(e))
        return err, [bits(d) for d in dsts], [d._version for d in dsts]

    want = outcome(stock_copy)
    before = one_pass_calls()
    got = outcome(entry)
    if name != "conj_src":
        assert one_pass_calls() == before
    # else: the dispatcher's Conjugate fallback resolves the conj bit before the op's kernel or
    # the mode's sees the source (the direct entry refuses it and goes through the op), and the
    # one-pass plan may take the resolved copy.
    assert got[0] == want[0]
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    assert got[2] == want[2]


@settings(max_examples=120, deadline=None)
@given(one_pass_cases())
def test_one_pass_plan_or_planner_always_matches_stock(c):
    stock = run(c, stock_copy)
    for entry in ENTRIES:
        assert_same(stock, run(c, entry))


@settings(max_examples=120, deadline=None)
@given(one_pass_cases())
def test_a_refused_call_writes_nothing(c):
    direct = _native.direct_op()
    dsts, srcs, storages = build(c)
    before = [storage_bytes(t) for t in storages]
    versions = [d._version for d in dsts]
    if direct(dsts, srcs, False):
        return
    assert all(torch.equal(a, storage_bytes(t)) for a, t in zip(before, storages))
    assert [d._version for d in dsts] == versions


@pytest.mark.parametrize("make", [
    lambda: ([torch.zeros(4), torch.zeros(5)], [torch.ones(4), torch.ones(5)]),
    lambda: (list(torch.zeros(12, dtype=bf16).split([4, 0, 8])) + [torch.zeros(3)],
             list(torch.ones(12).split([4, 0, 8])) + [torch.ones(3, dtype=bf16)]),
    lambda: ([torch.zeros(2), torch.zeros(3, dtype=i32), torch.zeros(4)],
             [torch.ones(2), torch.ones(3, dtype=i32), torch.ones(4)]),
], ids=["singles", "runs_empties_and_a_cast", "two_groups"])
def test_one_pass_plan_counts_what_the_planner_counts(make):
    before = one_pass_calls()
    one_pass = mode_paths(make)
    assert one_pass_calls() == before + 1
    assert one_pass == plan_paths(make) and one_pass[1] == {}


_WARN_ONCE_SCRIPT = """
import sys, warnings, torch, npu_dispatch as nd
from npu_dispatch import _native
t = torch.zeros(4)
torch._C._set_warn_deprecated_on_mutable_data_ptr(t)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    nd.foreach_copy_([torch.zeros(3), t], [torch.ones(3), torch.ones(4)])
print(_native.info()["one_pass_calls"], t.tolist(), [str(x.message)[:54] for x in w])
"""


def test_destination_data_access_warns_through_pythons_warnings_as_stock():
    # The warning is a TORCH_WARN_ONCE (once per process): a fresh interpreter, one-pass plan first. Its
    # handler is per thread: the one-pass plan's data access must stay on the calling thread.
    import subprocess

    out = subprocess.run([sys.executable, "-c", _WARN_ONCE_SCRIPT],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "1 [1.0, 1.0, 1.0, 1.0] ['Accessing the data pointer of FakeTensor is deprecated']"
    assert "deprecated" not in out.stderr


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("where", ["alone", "throw_first", "refusal_first", "same_pair"])
def test_a_destination_that_forbids_writes_raises_stocks_error(entry, where):
    # Only the error is stock's here: stock writes (and bumps) the pairs before the forbidden one,
    # and this library raises before writing any (a known difference, noted in the closing notes).
    def make():
        bad = torch.zeros(4)
        torch._C._set_throw_on_mutable_data_ptr(bad)
        strided = torch.ones(4, 2)[:, 0]
        d, s = [torch.zeros(4) for _ in range(3)], [torch.ones(4) for _ in range(3)]
        if where == "alone":  # every other pair plain: the one-pass plan itself meets the forbidden write
            d[1] = bad
            return d, s
        k_bad, k_strided = {"throw_first": (0, 2), "refusal_first": (2, 0), "same_pair": (1, 1)}[where]
        d[k_bad], s[k_strided] = bad, strided
        return d, s

    assert_stock_error(make, entry, "Cannot access data pointer")


def test_direct_one_pass_plan_counts_in_global_stats():
    nd.global_stats().reset()
    d = list(torch.zeros(10).split([4, 6])) + [torch.zeros(3)]
    nd.foreach_copy_(d, list(torch.ones(10).split([4, 6])) + [torch.ones(3)])
    s = nd.global_stats().as_dict()
    assert s["ops"]["npu_dispatch.foreach_copy_"]["calls"] == 1
    assert s["ops"]["npu_dispatch.foreach_copy_"]["fast_calls"] == 1
    assert s["paths"]["coalesced"] == {"calls": 1, "pairs": 2, "tensors": 2, "bytes": 40, "launches": 1}
    assert s["paths"]["foreach"] == {"calls": 1, "pairs": 1, "tensors": 1, "bytes": 12, "launches": 1}


def test_direct_one_pass_plan_steps_aside_for_a_mode():
    seen = []

    class Recorder(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    before = one_pass_calls()
    d = [torch.zeros(3)]
    with Recorder():
        nd.foreach_copy_(d, [torch.ones(3)])
    assert "npu_dispatch.foreach_copy_.default" in seen
    assert torch.equal(d[0], torch.ones(3)) and one_pass_calls() == before + 1  # the op's kernel took it


def test_large_copies_from_two_threads():
    # Above 2 MB the one-pass plan drops the GIL during the copy: both threads must get their own bytes.
    n = 400_000
    jobs = [([torch.zeros(n) for _ in range(2)], [torch.full((n,), float(k + i)) for i in range(2)]) for k in range(2)]
    errors = []

    def work(d, s):
        try:
            for _ in range(20):
                nd.foreach_copy_(d, s)
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for d, s in jobs:
        assert all(torch.equal(a, b) for a, b in zip(d, s))
        assert all(a._version == 20 for a in d)


# ---- review findings: each pinned against stock ---------------------------------------------


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
def test_bool_bytes_come_out_canonical_as_stock_writes_them(entry):
    def make():
        raw = torch.tensor([0, 2, 255, 1] * 5, dtype=torch.uint8)
        return [torch.zeros(20, dtype=torch.bool)], [raw.view(torch.bool)]

    d0, s0 = make()
    stock_copy(d0, s0)
    d1, s1 = make()
    entry(d1, s1)
    assert torch.equal(d1[0].view(torch.uint8), d0[0].view(torch.uint8))
    assert d0[0].view(torch.uint8).tolist()[:4] == [0, 1, 1, 1]


def test_a_refused_call_leaves_copy_on_write_destinations_shared():
    def make():
        a = torch.zeros(1 << 16)
        return [a._lazy_clone(), torch.zeros(3, requires_grad=True)], [torch.ones(1 << 16), torch.ones(3)]

    for fn in (stock_copy, direct_copy):
        d, s = make()
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            fn(d, s)
        assert torch._C._is_cow_tensor(d[0]), fn.__name__


def test_copy_on_write_destinations_are_copied_as_stock():
    a = torch.arange(6.0)
    d = [a._lazy_clone(), torch.zeros(2)]
    before = one_pass_calls()
    nd.foreach_copy_(d, [torch.ones(6), torch.ones(2)])
    assert torch.equal(d[0], torch.ones(6)) and torch.equal(a, torch.arange(6.0))
    assert not torch._C._is_cow_tensor(d[0]) and d[0]._version == 1
    assert one_pass_calls() == before  # the one-pass plan leaves it to the planner


@pytest.mark.parametrize("entry", [stock_copy, direct_copy, op_copy], ids=lambda f: f.__name__)
def test_forward_ad_tangents_get_stocks_error(entry):
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        src = fwad.make_dual(torch.arange(4.0), torch.full((4,), 7.0))
        with pytest.raises(NotImplementedError, match="forward AD with _foreach_copy_"):
            entry([torch.zeros(4)], [src])


@pytest.mark.parametrize("entry", [direct_copy, op_copy], ids=lambda f: f.__name__)
def test_below_ad_inplace_or_view_no_version_moves_as_with_stock(entry):
    for fn, want in ((stock_copy, [0, 0]), (entry, [0, 0])):
        d = [torch.zeros(4), torch.zeros(3)]
        with torch._C._AutoDispatchBelowADInplaceOrView():
            fn(d, [torch.ones(4), torch.ones(3)])
        assert [t._version for t in d] == want and torch.equal(d[0], torch.ones(4))


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("lazy", ["conj", "neg"])
def test_a_lazy_bit_destination_gets_stocks_error(entry, lazy):
    def make():
        if lazy == "conj":
            bad = torch.zeros(2, dtype=torch.complex64).conj()
            return [torch.zeros(2, dtype=torch.complex64), bad], [torch.ones(2, dtype=torch.complex64)] * 2
        return [torch.zeros(2), torch.zeros(2)._neg_view()], [torch.ones(2), torch.ones(2)]

    d, s = make()
    with pytest.raises(RuntimeError) as want:
        stock_copy(d, s)
    d, s = make()
    with pytest.raises(RuntimeError) as got:
        entry(d, s)
    # The op's own name stands where stock names aten::_foreach_copy_.
    assert str(got.value).replace("npu_dispatch::foreach_copy_", "aten::_foreach_copy_") == str(want.value)
    assert torch.equal(d[0], torch.zeros_like(d[0]))


def test_jit_trace_records_the_copy():
    def fn(a, b):
        nd.foreach_copy_([a], [b])
        return a + 0

    traced = torch.jit.trace(fn, (torch.zeros(3), torch.ones(3)))
    assert "aten::copy_" in str(traced.graph)  # stock's copies, as tracing stock records them
    out = traced(torch.zeros(3), torch.full((3,), 2.0))
    assert torch.equal(out, torch.full((3,), 2.0))


@pytest.mark.parametrize("before", [(0,), (3,), ()], ids=["after_empty", "after_cast", "after_0dim"])
def test_zero_dim_nan_casts_follow_stock_whatever_came_before(before):
    def make():
        nan = torch.tensor(0x7FC00000, dtype=torch.int32).view(f32)
        return [torch.zeros(before, dtype=bf16), torch.zeros((), dtype=bf16)], [torch.full(before, float("nan")), nan]

    # Stock's own bits for a 0-dim fp32 -> bf16 NaN follow stale stack memory (docs/stock_quirks.md):
    # there either of its two encodings passes, and every other destination compares exactly.
    d, s = make()
    stock_copy(d, s)
    want = [bits(t) for t in d]
    for entry in ENTRIES:
        d, s = make()
        entry(d, s)
        for a, b in zip(d, want):
            if a.dim() == 0:
                assert int.from_bytes(bytes(bits(a).tolist()), "little") in STOCK_EITHER, entry.__name__
            else:
                assert torch.equal(bits(a), b), entry.__name__


def test_lists_emptied_by_another_thread_during_the_copy():
    # Above 2 MB the copy runs without the GIL; another thread empties the lists meanwhile. The
    # call must keep its tensors alive until it has bumped their versions: tensors made right
    # after they die must start at version 0.
    for _ in range(3):
        n = 1 << 20
        d = [torch.zeros(n), torch.zeros(n)]
        s = [torch.ones(n), torch.ones(n)]
        fresh = []
        weakref.finalize(s[1], lambda: fresh.extend(torch.zeros(1) for _ in range(8)))
        go = threading.Event()

        def other():
            go.wait()
            d.clear()
            s.clear()

        t = threading.Thread(target=other)
        t.start()
        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            go.set()
            assert _native.direct_op()(d, s, False)
        finally:
            sys.setswitchinterval(old)
        t.join()
        gc.collect()
        assert fresh and all(x._version == 0 for x in fresh)


LARGE = 400_000  # elements per pair: past the parallel threshold, the GIL release (2 MB, 16-bit
# destinations too) and FBGEMM chunks


@pytest.mark.parametrize("sdt, ddt", [(f32, bf16), (bf16, f32), (f32, f16), (f16, f32), (f32, f32), (bf16, bf16)])
@pytest.mark.parametrize("adjacent", [False, True])
def test_large_lists_take_the_one_pass_plan_and_match_stock(sdt, ddt, adjacent):
    c = case([contiguous((LARGE + k,), sdt, ddt) for k in (0, 7, 33)], adjacent, adjacent, seed=3)
    before = one_pass_calls()
    assert_same(run(c, stock_copy), run(c, direct_copy))
    assert one_pass_calls() == before + 1


@settings(max_examples=60, deadline=None)
@given(one_pass_cases())
def test_one_pass_plan_counts_match_the_full_planner(c):
    make = lambda: build(c)[:2]
    assert mode_paths(make) == plan_paths(make)


def test_inference_destination_below_ad_inplace_or_view_raises_nothing_as_stock():
    def make():
        with torch.inference_mode():
            t = torch.zeros(3)
        return [torch.zeros(2), t], [torch.ones(2), torch.ones(3)]

    for entry in (stock_copy, direct_copy, op_copy):
        d, s = make()
        with torch._C._AutoDispatchBelowADInplaceOrView():
            entry(d, s)
        assert torch.equal(d[1], torch.ones(3)) and d[0]._version == 0, entry.__name__


def test_copy_in_below_ad_inplace_or_view_moves_no_version_as_stock():
    import torch.distributed.fsdp  # noqa: F401  registers fsdp::all_gather_copy_in

    for fn in (torch.ops.fsdp.all_gather_copy_in, nd.all_gather_copy_in,
               torch.ops.npu_dispatch.all_gather_copy_in.default):
        out = torch.zeros(20)
        with torch._C._AutoDispatchBelowADInplaceOrView():
            fn([torch.ones(4), torch.ones(6)], out, [4, 6], 10, 1)
        assert out._version == 0 and torch.equal(out[10:], torch.ones(10)), fn


def test_planning_materializes_no_copy_on_write_destination():
    a = torch.arange(8.0)
    d = [a._lazy_clone(), torch.zeros(4, 2).t()]
    s = [torch.ones(8), torch.ones(2, 4)]
    nd.explain(d, s)
    with pytest.raises(nd.FastCopyFallbackError):
        with nd.NpuFastCopyMode(strict=True):
            torch._foreach_copy_(d, s)
    assert torch._C._is_cow_tensor(d[0]) and torch.equal(d[0], torch.arange(8.0))


def test_a_destination_sharing_memory_with_its_source_by_copy_on_write_matches_stock():
    def make():
        a = torch.arange(6.0)
        return a, [a._lazy_clone(), torch.zeros(2)], [a.flip(0), torch.ones(2)]

    a0, d0, s0 = make()
    stock_copy(d0, s0)
    for entry in ENTRIES:
        a1, d1, s1 = make()
        entry(d1, s1)
        assert all(torch.equal(x, y) for x, y in zip(d0, d1)) and torch.equal(a1, a0), entry.__name__
        assert [t._version for t in d1] == [t._version for t in d0]


@pytest.mark.parametrize("pairs, numel", [(3, 50_000), (257, 700), (1000, 0), (64, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_destination_bumped_once_as_stock(pairs, numel, threads):
    # Each destination of the list, empty ones included, moves once, however the copy was split
    # across threads, as stock's.
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        sizes = [numel + (k % 5 if numel else 0) for k in range(pairs)]
        if numel == 0:
            sizes[::7] = [3] * len(sizes[::7])  # a few non-empty pairs among the empties
        mine, ref = ([torch.zeros(n) for n in sizes] for _ in range(2))
        srcs = [torch.randn(n) for n in sizes]
        before = one_pass_calls()
        nd.foreach_copy_(mine, srcs)
        torch._foreach_copy_(ref, srcs)
        assert one_pass_calls() == before + 1
        assert [t._version for t in mine] == [t._version for t in ref] == [1] * pairs
        assert all(torch.equal(a, b) for a, b in zip(mine, ref))
    finally:
        torch.set_num_threads(old)



def test_a_forbidden_write_late_in_a_long_list_raises_with_nothing_written():
    # The one-pass plan checks every pair before it writes one.
    dsts = [torch.zeros(4) for _ in range(200)]
    srcs = [torch.randn(4) for _ in range(200)]
    torch._C._set_throw_on_mutable_data_ptr(dsts[150])
    with pytest.raises(RuntimeError, match="Cannot access data pointer"):
        _native.direct_op()(dsts, srcs, False)
    assert all(d._version == 0 and not d.any() for k, d in enumerate(dsts) if k != 150)


@pytest.mark.parametrize("numel", [4, 20_000], ids=["copied_at_once", "above_the_gil_threshold"])
def test_the_profiler_sees_the_kernel_ranges(numel):
    base_d, base_s = torch.zeros(200 * numel), torch.randn(200 * numel)
    dsts, srcs = list(base_d.split(numel)), list(base_s.split(numel))
    before = one_pass_calls()
    with torch.profiler.profile() as prof:
        nd.foreach_copy_(dsts, srcs)
    assert one_pass_calls() == before + 1
    assert torch.equal(base_d, base_s)
    names = {e.name for e in prof.events()}
    assert {"npu_dispatch::cpu_kernel", "npu_dispatch::coalesced"} <= names


def _runs_worth_dissolving():
    # One adjacent run of 4 and a single, of one dtype pair: on a device batching 48 pairs a launch
    # the run costs a launch its pairs can share with the single's group.
    buf_d, buf_s = torch.zeros(40), torch.arange(40.0)
    return list(buf_d[:32].split(8)) + [torch.zeros(5)], list(buf_s[:32].split(8)) + [torch.ones(5)]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "dispatched"])
def test_a_batching_capability_on_cpu_counts_what_explain_plans(direct):
    from npu_dispatch.capabilities import npu_capability, override

    with override({"cpu": npu_capability("8.0.RC3")}):
        before = one_pass_calls()
        paths, reasons = mode_paths(_runs_worth_dissolving, direct=direct)
        want, _ = plan_paths(_runs_worth_dissolving)
        p = nd.explain(*_runs_worth_dissolving())
        dsts, srcs = _runs_worth_dissolving()
        nd.foreach_copy_(dsts, srcs)
    assert one_pass_calls() == before  # the planner dissolves runs on such a device
    assert p.runs == [] and p.launches == 1
    assert paths == want and paths["foreach"]["tensors"] == 5 and reasons == {}
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs))
