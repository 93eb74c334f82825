"""The threaded checks (csrc/planner/threaded_checks.h): long plain lists checked on every thread at once.

Its contract is the one-pass plan's over the whole list, so each test holds it to stock (bits,
versions, errors) and to what one pass would have done (the same calls refused, the same counts,
the same error for the same pair). Lists here are past its 96-pair threshold and run with two
threads; share boundaries fall at n * t / threads. The direct entry (``npu_dispatch.foreach_copy_``,
also inside ``NpuFastCopyMode``) takes the threaded checks; the op and the mode's kernels, below the
dispatcher, take one thread's one-pass plan, and are held to stock on the same lists.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import npu_dispatch as nd
from npu_dispatch import _native
from cases import (assert_same, assert_stock_error, build, direct_copy, one_pass_calls, one_pass_cases, mode_copy, mode_paths, plan_paths,
                   op_copy, run, stock_copy, storage_bytes)

if not _native.available():
    if os.environ.get("NPU_DISPATCH_REQUIRE_NATIVE") == "1":
        pytest.fail(f"native library required: {_native.status()[1]}", pytrace=False)
    pytest.skip(f"native library not built: {_native.status()[1]}", allow_module_level=True)

f32, f16, bf16, i32 = torch.float32, torch.float16, torch.bfloat16, torch.int32
ENTRIES = [direct_copy, op_copy, mode_copy]
N = 200  # two shares of 100 pairs with two threads


@pytest.fixture(autouse=True, params=[2, 3], ids=["2_threads", "3_threads"])
def threads(request):
    # Three shares: a run or an empty share chained across two boundaries.
    old = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(old)


def threaded_check_calls() -> int:
    return _native.info()["threaded_check_calls"]


@settings(max_examples=50, deadline=None)
@given(one_pass_cases(min_len=96, max_len=240))
def test_long_lists_match_stock_through_every_entry(c):
    stock = run(c, stock_copy)
    for entry in ENTRIES:
        assert_same(stock, run(c, entry))


@settings(max_examples=40, deadline=None)
@given(one_pass_cases(min_len=96, max_len=240))
def test_long_lists_count_what_the_full_planner_counts(c):
    # The direct entry takes the threaded checks, where it takes them.
    make = lambda: build(c)[:2]
    assert mode_paths(make, direct=True) == plan_paths(make)


def separate(n=N, numel=lambda i: 8 + i % 5, sdt=f32, ddt=f32):
    gen = torch.Generator().manual_seed(n)
    srcs = [torch.randn(numel(i), generator=gen).to(sdt) for i in range(n)]
    dsts = [torch.zeros(numel(i), dtype=ddt) for i in range(n)]
    return dsts, srcs


def split(sizes, sdt=f32, ddt=f32):
    total = sum(sizes)
    gen = torch.Generator().manual_seed(total)
    return list(torch.zeros(total, dtype=ddt).split(sizes)), list(torch.randn(total, generator=gen).to(sdt).split(sizes))


def three_groups():
    dsts, srcs = [], []
    for k in range(N):
        sdt, ddt = [(f32, f32), (f32, bf16), (i32, i32)][k % 3]
        dsts.append(torch.zeros(5 + k % 4, dtype=ddt))
        srcs.append(torch.arange(5 + k % 4).to(sdt) * (k + 1))
    return dsts, srcs


# Runs and groups around the share boundary (pair 100), each as one pass builds them.
BOUNDARY = {
    "separate": lambda: separate(),
    "one_run_across": lambda: split([3 + i % 4 for i in range(N)]),
    "run_starts_at_boundary": lambda: tuple(
        a + b for a, b in zip(separate(100), split([5] * 100))),
    "run_ends_at_boundary": lambda: tuple(
        a + b for a, b in zip(split([5] * 100), separate(100))),
    "single_then_run_across": lambda: tuple(
        a + b for a, b in zip(separate(99), split([4] * 101))),
    "empties_across": lambda: split([0 if 90 <= i < 120 else 3 for i in range(N)]),
    "second_share_all_empty": lambda: split([4] * 100 + [0] * 100),
    "empty_middle_share_chain": lambda: split([4] * 67 + [0] * 66 + [4] * 67),
    "dtype_change_at_boundary": lambda: tuple(
        a + b for a, b in zip(split([6] * 100), split([6] * 100, f32, bf16))),
    "cast_run_across": lambda: split([7 + i % 3 for i in range(N)], f32, bf16),
    "fp16_to_fp32_per_pair_tails": lambda: split([9 + i % 11 for i in range(N)], f16, f32),
    "three_groups_of_singles": lambda: three_groups(),
}


@pytest.mark.parametrize("name", sorted(BOUNDARY))
def test_boundary_runs_count_and_copy_as_one_thread_would(name):
    make = BOUNDARY[name]
    dsts, srcs = make()
    want = [torch.empty_like(d) for d in dsts]
    torch._foreach_copy_(want, srcs)
    before = threaded_check_calls()
    # The direct entry (the threaded checks) counts in the mode it is called in.
    got = mode_paths(lambda: (dsts, srcs), direct=True)
    assert threaded_check_calls() == before + 1
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(want, dsts) if a.numel())
    assert got == plan_paths(make)


def test_one_thread_takes_the_unthreaded_one_pass_plan():
    torch.set_num_threads(1)
    dsts, srcs = separate()
    before, passes = threaded_check_calls(), one_pass_calls()
    assert _native.direct_op()(dsts, srcs, False) is True
    assert threaded_check_calls() == before and one_pass_calls() == passes + 1
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs))


def raised(make, fn, threads):
    """(message, destinations, versions) after ``fn(*make())`` raised with ``threads`` threads."""
    torch.set_num_threads(threads)
    dsts, srcs = make()
    with pytest.raises(RuntimeError) as info:
        fn(dsts, srcs)
    return str(info.value), [d.clone() for d in dsts], [d._version for d in dsts]


def _numpy_backed(n_first, n_second, numel, dtype):
    # Two storages side by side in memory (one numpy buffer, two from_numpy tensors).
    buf = np.zeros((n_first + n_second) * numel, dtype=np.float32)
    a = torch.from_numpy(buf[: n_first * numel])
    b = torch.from_numpy(buf[n_first * numel:])
    return list(a.split(numel)) + list(b.split(numel)), buf


@pytest.mark.parametrize("side", ["dst", "src", "both"])
def test_runs_meeting_across_storages_at_the_boundary_are_refused_as_one_thread_refuses(side):
    def make():
        np_dsts, _ = _numpy_backed(100, 100, 4, f32)
        np_srcs, src_buf = _numpy_backed(100, 100, 4, f32)
        src_buf[:] = np.arange(src_buf.size, dtype=np.float32)
        dsts = np_dsts if side in ("dst", "both") else list(torch.zeros(800).split(4))
        srcs = np_srcs if side in ("src", "both") else list(torch.arange(800, dtype=f32).split(4))
        return dsts, srcs

    # One pass stops at pair 100 (a run would cross storages): nothing written, the planner next.
    dsts, srcs = make()
    passes = one_pass_calls()
    assert _native.direct_op()(dsts, srcs, False) is False
    assert not any(d.any() for d in dsts) and one_pass_calls() == passes

    def outcome(fn):
        dsts, srcs = make()
        fn(dsts, srcs)
        return [d.clone() for d in dsts], [d._version for d in dsts]

    want, got = outcome(stock_copy), outcome(direct_copy)
    assert all(torch.equal(a, b) for a, b in zip(want[0], got[0])) and want[1] == got[1]


def test_an_overlap_inside_a_share_does_not_hide_a_later_refused_join():
    # One pass meets pair 100 (a run crossing storages) before it compares any spans, so it
    # refuses; the overlap inside the first share (srcs[10] is dsts[20]) and the forbidden write
    # at pair 150 are then the planner's, which raises stock's error.
    def make():
        dsts, _ = _numpy_backed(100, 100, 4, f32)
        srcs, buf = _numpy_backed(100, 100, 4, f32)
        buf[:] = np.arange(buf.size, dtype=np.float32)
        srcs[10] = dsts[20]
        bad = torch.zeros(4)
        torch._C._set_throw_on_mutable_data_ptr(bad)
        dsts[150] = bad
        return dsts, srcs

    assert _native.direct_op()(*make(), False) is False

    def outcome(fn, threads):
        return raised(make, fn, threads)

    one, many = outcome(direct_copy, 1), outcome(direct_copy, 2)
    assert one[0] == many[0] == outcome(stock_copy, 2)[0]
    assert all(torch.equal(a, b) for a, b in zip(one[1], many[1])) and one[2] == many[2]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
def test_a_refused_join_then_a_forbidden_write_raises_as_one_thread_does(entry):
    # One pass stops at pair 100 (its run would cross storages) before the forbidden write at
    # pair 150; the planner then raises stock's error having written nothing (stock writes pairs
    # 0..149 first: a known difference of the planner's executor, one thread or two).
    def make():
        dsts, _ = _numpy_backed(100, 100, 4, f32)
        srcs, buf = _numpy_backed(100, 100, 4, f32)
        buf[:] = np.arange(buf.size, dtype=np.float32)
        bad = torch.zeros(4)
        torch._C._set_throw_on_mutable_data_ptr(bad)
        dsts[150] = bad
        return dsts, srcs

    def outcome(fn, threads):
        return raised(make, fn, threads)

    want = outcome(stock_copy, 2)
    one, two = outcome(entry, 1), outcome(entry, 2)
    assert want[0] == one[0] == two[0]
    assert all(torch.equal(a, b) for a, b in zip(one[1], two[1])) and one[2] == two[2]
    torch.set_num_threads(2)
    assert _native.direct_op()(*make(), False) is False  # refused at pair 100, not raised at 150


def assert_matches_stock(make, entry):
    """``entry(*make())`` leaves the destinations' values and versions as ``stock_copy`` does."""
    def outcome(fn):
        d, s = make()
        fn(d, s)
        return [x.clone() for x in d], [x._version for x in d]

    want, got = outcome(stock_copy), outcome(entry)
    assert all(torch.equal(a, b) for a, b in zip(want[0], got[0]))
    assert want[1] == got[1]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("kind", ["dst_meets_src", "dst_meets_dst", "src_meets_dst"])
def test_memory_shared_across_shares_is_refused_and_matches_stock(entry, kind):
    def make():
        dsts, srcs = separate(numel=lambda i: 6)
        shared = torch.arange(12, dtype=f32)
        if kind == "dst_meets_src":  # a destination of share 1 overlaps a source of share 0
            dsts[150], srcs[10] = shared[:6], shared[3:9]
        elif kind == "dst_meets_dst":
            dsts[10], dsts[150] = shared[:6], shared[2:8]
        else:  # a source of share 1 overlaps a destination of share 0
            dsts[10], srcs[150] = shared[:6], shared[3:9]
        return dsts, srcs

    dsts, srcs = make()
    snapshot = [storage_bytes(t) for t in dsts]
    assert _native.direct_op()(dsts, srcs, False) is False
    assert all(torch.equal(a, storage_bytes(t)) for a, t in zip(snapshot, dsts))

    assert_matches_stock(make, entry)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
def test_a_source_met_out_of_address_order_is_compared_within_its_share(entry):
    # Destinations are views 10 elements apart in one base; srcs[0] lies in a gap inside the first
    # share's destinations (with 2 and 3 threads), so the comparison has moved past dsts[0] when
    # srcs[1] (dsts[0] itself) comes: one pass refuses the call, and so must its share.
    def make():
        b = torch.arange(1200.0)
        dsts = [b[10 * k:10 * k + 4] for k in range(120)]
        srcs = [torch.full((4,), float(k)) for k in range(120)]
        srcs[0], srcs[1] = b[386:390], b[0:4]
        return dsts, srcs

    dsts, srcs = make()
    before = threaded_check_calls()
    assert _native.direct_op()(dsts, srcs, False) is False
    assert threaded_check_calls() == before

    assert_matches_stock(make, entry)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("where", ["alone", "refusal_in_share_0_first", "refusal_after", "two_forbidden"])
def test_a_forbidden_write_in_the_second_share_raises_stocks_error(entry, where):
    def make():
        dsts, srcs = separate(numel=lambda i: 4)
        bad = torch.zeros(4)
        torch._C._set_throw_on_mutable_data_ptr(bad)
        dsts[150] = bad
        if where == "refusal_in_share_0_first":
            srcs[20] = torch.ones(4, 2)[:, 0]
        elif where == "refusal_after":
            srcs[180] = torch.ones(4, 2)[:, 0]
        elif where == "two_forbidden":
            other = torch.zeros(4)
            torch._C._set_throw_on_mutable_data_ptr(other)
            dsts[120] = other
        return dsts, srcs

    assert_stock_error(make, entry, "Cannot access data pointer")


def test_the_one_pass_plan_writes_nothing_before_raising_for_a_forbidden_write():
    dsts, srcs = separate(numel=lambda i: 4)
    bad = torch.zeros(4)
    torch._C._set_throw_on_mutable_data_ptr(bad)
    dsts[150] = bad
    with pytest.raises(RuntimeError, match="Cannot access data pointer"):
        _native.direct_op()(dsts, srcs, False)
    assert all(d._version == 0 and not d.any() for k, d in enumerate(dsts) if k != 150)


_WARN_SCRIPT = """
import warnings, torch, npu_dispatch as nd
from npu_dispatch import _native
torch.set_num_threads(2)
dsts = [torch.zeros(4) for _ in range(200)]
srcs = [torch.ones(4) for _ in range(200)]
torch._C._set_warn_deprecated_on_mutable_data_ptr(dsts[150])
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    nd.foreach_copy_(dsts, srcs)
info = _native.info()
print(info["threaded_check_calls"], all(bool((d == 1).all()) for d in dsts), [str(x.message)[:54] for x in w])
"""


def test_a_warning_from_the_second_share_reaches_pythons_warnings():
    # TORCH_WARN_ONCE: a fresh interpreter. Issued on a worker thread, it must come out on the
    # calling thread, through Python's warnings, not printed by the worker's default handler.
    out = subprocess.run([sys.executable, "-c", _WARN_SCRIPT], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "1 True ['Accessing the data pointer of FakeTensor is deprecated']"
    assert "deprecated" not in out.stderr


_WARN_PAST_A_STOP = """
import warnings, torch, npu_dispatch as nd
torch.set_num_threads(2)
dsts = [torch.zeros(4) for _ in range(200)]
srcs = [torch.ones(4) for _ in range(200)]
torch._C._set_warn_deprecated_on_mutable_data_ptr(dsts[150])
if "{stop}" == "refusal":
    srcs[20] = torch.ones(4, 2)[:, 0]  # one pass refuses here; the planner serves the call
elif "{stop}" == "error":
    torch._C._set_throw_on_mutable_data_ptr(dsts[20])  # one pass raises here
else:  # one pass warns at pair 98, then raises at 99; a worker may spend the once at 150 first
    torch._C._set_warn_deprecated_on_mutable_data_ptr(dsts[98])
    torch._C._set_throw_on_mutable_data_ptr(dsts[99])
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    try:
        nd.foreach_copy_(dsts, srcs)
        error = None
    except RuntimeError as e:
        error = str(e)[:26]
print(error, [str(x.message)[:24] for x in w])
"""


@pytest.mark.parametrize("stop, want", [
    # Stock warns once, at pair 150, and so does the planner that serves a refused call; the
    # warning a worker met there (a TORCH_WARN_ONCE, spent) comes out with the refusal.
    ("refusal", "None ['Accessing the data point']"),
    # Stock, and one pass, raise at pair 20 and never reach pair 150; the worker did, and its
    # once is spent: the warning comes out with the error rather than never (csrc/planner/threaded_checks.h).
    ("error", "Cannot access data pointer ['Accessing the data point']"),
    # Stock and one pass: the warning at pair 98, then the error at 99.
    ("warned_then_error", "Cannot access data pointer ['Accessing the data point']"),
])
def test_a_warning_past_where_one_thread_stops(stop, want):
    out = subprocess.run([sys.executable, "-c", _WARN_PAST_A_STOP.replace("{stop}", stop)],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == want
    assert "deprecated" not in out.stderr


def test_fbgemm_chunks_follow_the_calling_threads_count():
    # A pair past GRAIN_SIZE splits into one FBGEMM call per thread under stock, each chunk with
    # its own scalar tail (which writes every NaN as 0x7fffffff). Its chunks are planned on a
    # worker thread here, which must still split as the calling thread's copy_ would.
    n = 70_001  # one chunk per thread, each length not a multiple of 8: a scalar tail each
    big = torch.full((n,), 0x7D01, dtype=torch.int16)  # every element a signalling NaN
    # The big pair last: in the last share, planned on a worker thread.
    srcs = [torch.full((8,), 0.5, dtype=f16) for _ in range(120)] + [big.view(f16)]
    dsts = [torch.zeros(8) for _ in range(120)] + [torch.zeros(n)]
    want = [torch.empty_like(d) for d in dsts]
    torch._foreach_copy_(want, srcs)
    before = threaded_check_calls()
    nd.foreach_copy_(dsts, srcs)
    assert threaded_check_calls() == before + 1
    assert all(torch.equal(a.view(i32), b.view(i32)) for a, b in zip(want, dsts))
    tails = (want[-1].view(i32) == 0x7FFFFFFF).sum().item()
    assert 0 < tails < n  # the scalar tails' NaN, and the vector path's elsewhere


def test_calls_above_the_gil_threshold_copy_after_the_region():
    dsts, srcs = separate(120, numel=lambda i: 20_000 + i)  # about 9.6 MB of destinations
    want = [torch.empty_like(d) for d in dsts]
    torch._foreach_copy_(want, srcs)
    before = threaded_check_calls()
    nd.foreach_copy_(dsts, srcs)
    assert threaded_check_calls() == before + 1
    assert all(torch.equal(a, b) for a, b in zip(want, dsts))
    assert [d._version for d in dsts] == [1] * 120


# Each thread's pass runs its items last to first on every other call (CpuCopyBatch::alternate).
PASSES = {
    "own_shares": lambda: separate(),
    "byte_split_through_a_pair": lambda: separate(numel=lambda i: 30_000 if i == 3 else 8 + i % 5),
    "coalesced_runs": lambda: split([3 + i % 4 for i in range(N)]),
    "above_the_gil_threshold": lambda: separate(120, numel=lambda i: 20_000 + i),
}


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", sorted(PASSES))
def test_passes_in_either_direction_write_every_byte(entry, name):
    dsts, srcs = PASSES[name]()
    want = [torch.empty_like(d) for d in dsts]
    torch._foreach_copy_(want, srcs)
    for _ in range(3):  # both directions on every thread, whatever the last test left
        for d in dsts:
            d.view(torch.uint8).fill_(0xA5)
        entry(dsts, srcs)
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(want, dsts))


@pytest.mark.parametrize("views", [False, True], ids=["separate", "views_of_one_base"])
def test_versions_move_once_per_destination_as_stock(views):
    if views:
        base = torch.zeros(N * 4)
        dsts = list(base.split(4))
    else:
        dsts = [torch.zeros(4) for _ in range(N)]
    srcs = [torch.ones(4) for _ in range(N)]
    nd.foreach_copy_(dsts, srcs)
    nd.foreach_copy_(dsts, srcs)
    assert [d._version for d in dsts] == [2 * N if views else 2] * N
    if views:
        assert base._version == 2 * N


@pytest.mark.parametrize("numel", [16, 4000], ids=["in_region", "above_the_gil_threshold"])
def test_profiler_ranges_are_one_threads(threads, numel):
    # Runs 0..98 and 101..199 of one buffer with a gap on each side of pairs 99 and 100: one pass
    # makes 99-100 a run too; shares split there and join it back, emptying the group of singles.
    def make():
        sizes = [numel] * 200
        offsets, off = [], 0
        for k in range(200):
            off += 1 if k in (99, 101) else 0  # the gaps
            offsets.append(off)
            off += numel
        dst_buf, src_buf = torch.zeros(off), torch.arange(off, dtype=f32)
        return ([dst_buf[o:o + n] for o, n in zip(offsets, sizes)],
                [src_buf[o:o + n] for o, n in zip(offsets, sizes)])

    def names(n_threads):
        torch.set_num_threads(n_threads)
        dsts, srcs = make()
        with torch.profiler.profile() as prof:
            nd.foreach_copy_(dsts, srcs)
        return sorted(e.name for e in prof.events() if e.name.startswith("npu_dispatch::"))

    assert names(threads) == names(1) == ["npu_dispatch::coalesced", "npu_dispatch::cpu_kernel"]


def test_profiler_sees_the_kernel_ranges():
    dsts, srcs = split([4] * N)
    with torch.profiler.profile() as prof:
        nd.foreach_copy_(dsts, srcs)
    names = {e.name for e in prof.events()}
    assert {"npu_dispatch::cpu_kernel", "npu_dispatch::coalesced"} <= names
