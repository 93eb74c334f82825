"""NpuFastCopyMode against the stock ops: bitwise results, errors, version counters, stats."""
from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from hypothesis import given, settings
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import TorchDispatchMode

import npu_dispatch as nd
from npu_dispatch import _native
from cases import Case, interception_only, Pair, assert_same, bits, build, cases, mode_copy, run, stock_copy

f32, bf16 = torch.float32, torch.bfloat16


def verify_copy(dsts, srcs):
    with nd.NpuFastCopyMode(verify=True):
        torch._foreach_copy_(dsts, srcs)


@settings(max_examples=120, deadline=None)
@given(cases(max_len=120))
def test_foreach_copy_matches_stock_bitwise(case):
    assert_same(run(case, stock_copy), run(case, mode_copy))


@settings(max_examples=25, deadline=None)
@given(cases(max_len=40))
def test_verify_mode_agrees_with_stock(case):
    assert_same(run(case, stock_copy), run(case, verify_copy))


@settings(max_examples=40, deadline=None)
@given(cases(max_len=60))
def test_functional_foreach_copy_matches_stock(case):
    def stock(d, s):
        return torch.ops.aten._foreach_copy.default(d, s)

    def ours(d, s):
        with nd.NpuFastCopyMode():
            return torch.ops.aten._foreach_copy.default(d, s)

    assert_same(run(case, stock), run(case, ours))


def test_fsdp_mixed_precision_copy_in_is_one_flat_copy_each():
    # FSDP's cast of separate fp32 shards into one bf16 buffer (a foreach group), then the copy-in
    # of those adjacent splits: one flat copy.
    sizes = [((k * 37) % 257) + 1 for k in range(50)]
    shards = [torch.randn(n) for n in sizes]
    numel, world, rank = sum(sizes), 4, 2

    def go(mode):
        flat = torch.empty(numel, dtype=bf16)
        splits = torch.split(flat, sizes)
        out = torch.empty(numel * world, dtype=bf16)
        if mode is None:
            torch._foreach_copy_(splits, shards)
            r = torch.ops.fsdp.all_gather_copy_in(splits, out, sizes, numel, rank)
        else:
            with mode:
                torch._foreach_copy_(splits, shards)
                r = torch.ops.fsdp.all_gather_copy_in(splits, out, sizes, numel, rank)
        return flat, out, r

    flat0, out0, (inp0, o0) = go(None)
    mode = nd.NpuFastCopyMode()
    flat1, out1, (inp1, o1) = go(mode)
    assert torch.equal(bits(flat0), bits(flat1))
    assert torch.equal(bits(out0[numel * rank: numel * (rank + 1)]), bits(out1[numel * rank: numel * (rank + 1)]))
    assert o1 is out1 and inp1._base is out1 and inp0._base is out0
    assert inp1.storage_offset() == inp0.storage_offset() == numel * rank
    assert out1._version == out0._version and flat1._version == flat0._version
    d = mode.stats.as_dict()
    assert d["paths"]["coalesced"] == {"calls": 1, "pairs": 50, "tensors": 50, "bytes": 2 * numel, "launches": 1}
    assert d["paths"]["foreach"]["tensors"] == 50
    assert d["ops"]["fsdp.all_gather_copy_in"]["fast_calls"] == 1
    assert d["ops"]["aten._foreach_copy_"]["fast_calls"] == 1
    assert mode.stats.total_fallback_calls == 0


@pytest.mark.parametrize("rank", [0, 1, 3])
@pytest.mark.parametrize("out_dtype", [bf16, f32, torch.uint8])
def test_all_gather_copy_in_separate_shards_matches_stock(rank, out_dtype):
    sizes = [5, 0, 17, 1, 64, 3]
    numel = sum(sizes)

    def go(use_mode):
        g = torch.Generator().manual_seed(rank)
        ins = [torch.randint(0, 255, (n,), generator=g).to(out_dtype) for n in sizes]
        out = torch.full((numel * 4,), 7, dtype=out_dtype)
        if use_mode:
            with nd.NpuFastCopyMode():
                r = torch.ops.fsdp.all_gather_copy_in(ins, out, sizes, numel, rank)
        else:
            r = torch.ops.fsdp.all_gather_copy_in(ins, out, sizes, numel, rank)
        return out, r

    out0, r0 = go(False)
    out1, r1 = go(True)
    assert torch.equal(bits(out0), bits(out1))
    assert r1[1] is out1 and r1[0].shape == r0[0].shape and r1[0].storage_offset() == r0[0].storage_offset()
    assert out1._version == out0._version


@pytest.mark.parametrize(
    "args",
    [
        ([5, 5], 10, 2),  # narrow past the end of the output
        ([5, 4], 10, 1),  # split sizes do not sum to the input numel
        ([], 0, 0),  # no inputs
    ],
)
def test_all_gather_copy_in_errors_match_stock(args):
    sizes, numel, rank = args

    def go(use_mode):
        ins = [torch.ones(n) for n in sizes]
        out = torch.zeros(20)
        try:
            if use_mode:
                with nd.NpuFastCopyMode():
                    torch.ops.fsdp.all_gather_copy_in(ins, out, sizes, numel, rank)
            else:
                torch.ops.fsdp.all_gather_copy_in(ins, out, sizes, numel, rank)
        except Exception as e:
            return (type(e), str(e)), out
        return None, out

    (e0, o0), (e1, o1) = go(False), go(True)
    assert e0 is not None and e1 == e0
    assert torch.equal(o0, o1)


BAD_CASES = {
    "empty": (lambda: ([], [])),
    "empty_src": (lambda: ([torch.zeros(2)], [])),
    "unequal": (lambda: ([torch.zeros(2)], [torch.ones(2), torch.ones(2)])),
    "shape_midway": (lambda: ([torch.zeros(2), torch.zeros(3), torch.zeros(2)], [torch.ones(2), torch.ones(2), torch.ones(2)])),
    "expanded_dst": (lambda: ([torch.zeros(2), torch.zeros(1).expand(4)], [torch.ones(2), torch.arange(4.0)])),
}


@pytest.mark.parametrize("name", list(BAD_CASES))
@pytest.mark.parametrize("how", ["mode", "direct"])
def test_errors_match_stock_and_writes_match(name, how):
    d0, s0 = BAD_CASES[name]()
    d1, s1 = BAD_CASES[name]()
    with pytest.raises(Exception) as stock_err:
        torch._foreach_copy_(d0, s0)
    with pytest.raises(Exception) as our_err:
        if how == "mode":
            with nd.NpuFastCopyMode():
                torch._foreach_copy_(d1, s1)
        else:
            nd.foreach_copy_(d1, s1)
    assert type(our_err.value) is type(stock_err.value)
    assert str(our_err.value) == str(stock_err.value)
    for a, b in zip(d0, d1):
        assert torch.equal(a, b)  # same pairs written before the error (stock's loop order)


def test_aliasing_at_other_indices_matches_sequential_loop():
    def case():
        x = torch.arange(8.0)
        return x, [x[0:4], x[4:8]], [x[4:8], x[0:4]]

    x0, d0, s0 = case()
    torch._foreach_copy_(d0, s0)
    x1, d1, s1 = case()
    mode = nd.NpuFastCopyMode()
    with mode:
        torch._foreach_copy_(d1, s1)
    assert torch.equal(x0, x1)  # [4,5,6,7,4,5,6,7]: the loop reads dst[0] after writing it
    # Both pairs of the call stay on stock's loop: 2 pairs, 1 call.
    assert mode.stats.fallback_reasons["aliasing"] == 2
    assert mode.stats.as_dict()["fallbacks"] == {"aliasing": {"pairs": 2, "calls": 1}}


@pytest.mark.parametrize("make, reason", [
    (lambda: ([torch.zeros(4, 4).t(), torch.zeros(3)], [torch.ones(4, 4), torch.ones(3)]),
     r"src\[0\] strides \(4, 1\) differ from dst\[0\] strides \(1, 4\)"),
    (lambda: ([torch.zeros(3), torch.zeros(4, 2)[:, 0]], [torch.ones(3), torch.ones(4)]), r"dst\[1\] is not dense"),
])
def test_strict_raises_naming_the_reason_before_writing(make, reason):
    d, s = make()
    with pytest.raises(nd.FastCopyFallbackError, match=reason):
        with nd.NpuFastCopyMode(strict=True):
            torch._foreach_copy_(d, s)
    assert all(t.count_nonzero() == 0 for t in d)
    with nd.NpuFastCopyMode(strict=True):  # all on the fast route: no error
        torch._foreach_copy_([torch.zeros(3)], [torch.ones(3)])


@pytest.mark.parametrize("case", ["not_dense", "aliasing"])
@pytest.mark.parametrize("verify", [False, True], ids=["strict", "strict_verify"])
def test_strict_all_gather_copy_in_names_the_reason_before_writing(verify, case):
    # A shard that is not dense: the copy-in's split stays on stock's copy_, which strict refuses,
    # naming the reason and writing nothing. A shard in the output's storage as well: the whole
    # call is stock's, named by that reason alone (as the call would count it).
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  registers fsdp::

    out = torch.zeros(16)
    first = out[12:15] if case == "aliasing" else torch.ones(3)
    with pytest.raises(nd.FastCopyFallbackError, match=f"all_gather_copy_in falls back: {case}$"):
        with nd.NpuFastCopyMode(strict=True, verify=verify):
            torch.ops.fsdp.all_gather_copy_in([first, torch.arange(10.0)[::2]], out, [3, 5], 8, 1)
    assert out.count_nonzero() == 0 and out._version == 0


def test_verify_takes_a_copy_in_whose_shard_is_in_the_output_as_stock_does():
    # The shard reads what the call writes: no clone of the output is a reference for it.
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  registers fsdp::

    def call(out):
        return torch.ops.fsdp.all_gather_copy_in([torch.arange(8.0), out[8:11]], out, [8, 3], 11, 0)

    want = torch.arange(22.0)
    call(want)
    got = torch.arange(22.0)
    with nd.NpuFastCopyMode(verify=True) as mode:
        call(got)
    assert torch.equal(got, want) and got._version == want._version
    assert mode.stats.fallback_reasons == {"aliasing": 2}


@interception_only
def test_subclass_inner_copy_reaches_fast_path():
    a = TwoTensor(torch.zeros(6), torch.zeros(6))
    b = TwoTensor(torch.arange(6.0), torch.arange(6.0) * 2)
    mode = nd.NpuFastCopyMode()
    with mode:
        torch._foreach_copy_([a], [b])
    assert torch.equal(a.a, torch.arange(6.0)) and torch.equal(a.b, torch.arange(6.0) * 2)
    # The wrapper unwraps itself above BackendSelect; its plain copies take the fast path.
    assert mode.stats.fast_calls["aten._foreach_copy_"] >= 1 and not mode.stats.fallback_reasons


def test_other_ops_pass_through_and_nesting_counts_once():
    outer, inner = nd.NpuFastCopyMode(), nd.NpuFastCopyMode()
    d, s = [torch.zeros(3), torch.zeros(2, 2).t()], [torch.ones(3), torch.ones(2, 2)]
    with outer:
        y = torch.ones(3) + 1
        with inner:
            torch._foreach_copy_(d, s)
    assert torch.equal(y, torch.full((3,), 2.0))
    assert inner.stats.op_calls["aten._foreach_copy_"] == 1
    assert outer.stats.op_calls["aten._foreach_copy_"] == 0  # the inner engine's stock calls pass through
    assert torch.equal(d[0], s[0]) and torch.equal(d[1], s[1])


def test_stats_are_thread_safe():
    mode = nd.NpuFastCopyMode()
    n_threads, n_calls = 4, 50

    def work():
        with mode:
            for _ in range(n_calls):
                torch._foreach_copy_([torch.zeros(4)], [torch.ones(4)])

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mode.stats.op_calls["aten._foreach_copy_"] == n_threads * n_calls
    assert mode.stats.tensors["coalesced"] + mode.stats.tensors["foreach"] == n_threads * n_calls


def test_report_is_a_readable_table():
    mode = nd.NpuFastCopyMode()
    with mode:
        torch._foreach_copy_([torch.zeros(4), torch.zeros(2, 2).t()], [torch.ones(4), torch.ones(2, 2)])
        torch._foreach_copy_([torch.zeros(3)], [torch.ones(3)])
    text = mode.stats.report()
    lines = text.splitlines()
    assert lines[0].split() == ["op", "path", "calls", "pairs", "bytes", "launches", "host", "ms"]
    op_row = next(line for line in lines if line.startswith("aten._foreach_copy_"))
    assert op_row.split()[1:4] == ["(all", "paths)", "2"]  # 2 calls of the op
    fallback = next(line.split() for line in lines if line.split()[:1] == ["fallback"])
    assert fallback[1:5] == ["1", "1", "16", "1"]  # 1 call, 1 pair, 16 bytes, 1 launch
    foreach = next(line.split() for line in lines if line.split()[:1] == ["foreach"])
    assert foreach[1:4] == ["2", "2", "28"]  # the first call's 4 floats and the second's 3
    total = next(line.split() for line in lines if line.startswith("total"))
    assert total[3:6] == ["2", "3", "44"]  # calls, pairs and bytes add up
    reason = next(line.split() for line in lines if line.startswith("strides"))
    assert reason[1:] == ["1", "1"]  # 1 pair, in 1 call


def test_profiler_shows_named_ranges():
    with torch.profiler.profile() as prof:
        with nd.NpuFastCopyMode():
            x = torch.empty(8)
            torch._foreach_copy_(list(torch.split(x, 4)), list(torch.split(torch.ones(8), 4)))
    names = {e.name for e in prof.events()}
    assert "npu_dispatch::coalesced" in names


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _traced_copy(d, s):
    torch._foreach_copy_(d, s)
    return d


def _traced_copy_in(inputs, out):
    return torch.ops.fsdp.all_gather_copy_in(inputs, out, [3, 5], 8, 1)


@interception_only
@pytest.mark.parametrize("op", ["foreach_copy_", "all_gather_copy_in"])
def test_make_fx_real_under_the_mode_records_the_op(op):
    # make_fx's proxy mode acts at the Python key, before the mode's kernels at BackendSelect: the
    # graph keeps the copy.
    from torch.fx.experimental.proxy_tensor import make_fx

    if op == "foreach_copy_":
        fn, target = _traced_copy, torch.ops.aten._foreach_copy_.default
        make_args = lambda: ([torch.zeros(3), torch.zeros(5)], [torch.randn(3), torch.randn(5)])  # noqa: E731
    else:
        fn, target = _traced_copy_in, torch.ops.fsdp.all_gather_copy_in.default
        make_args = lambda: ([torch.randn(3), torch.randn(5)], torch.zeros(16))  # noqa: E731
    stock_graph = make_fx(fn, tracing_mode="real")(*make_args())
    mode = nd.NpuFastCopyMode()
    with mode:
        graph = make_fx(fn, tracing_mode="real")(*make_args())
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert targets == [n.target for n in stock_graph.graph.nodes if n.op == "call_function"]
    assert target in targets
    # The proxy mode records the op, then runs it on the real tensors: that run is served.
    assert mode.stats.fast_path_calls == 1 and not mode.stats.fallback_reasons
    # The traced graph, run later without the mode, copies as stock.
    torch.manual_seed(0)
    args = make_args()
    torch.manual_seed(0)
    ref = make_args()
    out, want = graph(*args), fn(*ref)
    leaves = torch.utils._pytree.tree_leaves
    assert len(leaves(out)) == len(leaves(want))
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(leaves(out), leaves(want)))


@interception_only
@pytest.mark.parametrize("infra", ["functional", "fake"])
def test_plain_tensors_under_an_infra_mode_meet_stock(infra):
    # Plain tensors while functionalization or a FakeTensorMode is set: stock copies (functional)
    # or raises (fake, real inputs); the infra mode acts before the mode's kernels, as without them.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    make = FunctionalTensorMode if infra == "functional" else FakeTensorMode

    def attempt(mode):
        torch.manual_seed(0)
        d, s = [torch.zeros(3), torch.zeros(4)], [torch.randn(3), torch.randn(4)]
        try:
            with make(), (mode if mode is not None else contextlib.nullcontext()):
                torch._foreach_copy_(d, s)
        except Exception as e:  # noqa: BLE001  compared with stock's below
            return d, (type(e), str(e))
        return d, None

    stock_d, stock_err = attempt(None)
    mode = nd.NpuFastCopyMode()
    ours_d, ours_err = attempt(mode)
    assert ours_err == stock_err and (stock_err is None) == (infra == "functional")
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(stock_d, ours_d))
    assert not mode.stats.fallback_reasons


def test_under_another_mode_results_still_match():
    d0, s0, _ = build(Case((Pair((3, 4), f32, bf16, "contiguous", "contiguous"),) * 5, True, True, (), 1))
    d1, s1, _ = build(Case((Pair((3, 4), f32, bf16, "contiguous", "contiguous"),) * 5, True, True, (), 1))
    torch._foreach_copy_(d0, s0)
    with _Passthrough(), nd.NpuFastCopyMode():
        torch._foreach_copy_(d1, s1)
    for a, b in zip(d0, d1):
        assert torch.equal(bits(a), bits(b))


# ---- known classes of upstream foreach bugs, pinned as explicit cases --------------------------

UPSTREAM_BUG_CLASSES = {
    # destination lists holding several dtypes (fast route must group, not assume dst[0]'s dtype)
    "several_dst_dtypes": Case(
        tuple(Pair((33,), f32, dt, "contiguous", "contiguous") for dt in (bf16, f32, torch.float16, torch.int32) * 3),
        True, True, (), 11),
    # size-0 tensors between large ones (large = past ATen's parallel grain of 32768 elements)
    "empty_between_large": Case(
        (Pair((70000,), f32, bf16, "contiguous", "contiguous"), Pair((0,), f32, bf16, "contiguous", "contiguous"),
         Pair((40000,), f32, bf16, "contiguous", "contiguous"), Pair((0, 3), f32, bf16, "contiguous", "contiguous"),
         Pair((65537,), f32, bf16, "contiguous", "contiguous")),
        True, True, (), 12),
    # stride differences on size-1 dims only: still the fast route
    "size1_strides": Case(
        tuple(Pair((3, 1, 5), f32, f32, lay, "contiguous") for lay in ("size1_strides", "contiguous") * 4),
        False, False, (), 13),
    # sources that alias destinations at other indices
    "src_aliases_other_dst": Case(
        tuple(Pair((16,), f32, f32, "contiguous", "contiguous") for _ in range(6)),
        True, True, ((0, 1), (3, 2), (5, 0)), 14),
}


@pytest.mark.parametrize("name", list(UPSTREAM_BUG_CLASSES))
@pytest.mark.parametrize("how", ["mode", "direct"])
def test_upstream_foreach_bug_classes(name, how):
    case = UPSTREAM_BUG_CLASSES[name]
    ours = mode_copy if how == "mode" else nd.foreach_copy_
    assert_same(run(case, stock_copy), run(case, ours))


# ---- parity corner cases (each was a defect once) -----------------------------------------------


def _both(make, call=None):
    """Run ``make()`` twice: stock, then under the mode; return (stock, ours) as (error, dsts, versions)."""
    call = call or (lambda d, s: torch._foreach_copy_(d, s))
    out = []
    for use_mode in (False, True):
        d, s = make()
        try:
            if use_mode:
                with nd.NpuFastCopyMode():
                    call(d, s)
            else:
                call(d, s)
            err = None
        except Exception as e:
            err = (type(e), str(e))
        out.append((err, [bits(t) for t in d], [None if t.is_inference() else t._version for t in d]))
    return out


def _assert_parity(stock, ours):
    assert ours[0] == stock[0]
    assert all(torch.equal(a, b) for a, b in zip(stock[1], ours[1]))
    assert ours[2] == stock[2]


def test_versions_on_error_paths_match_stock():
    # Stock's loop bumps each pair it wrote before it raised.
    _assert_parity(*_both(lambda: ([torch.zeros(2), torch.zeros(3), torch.zeros(2)], [torch.ones(2)] * 3)))


def test_versions_under_inference_mode_match_stock():
    def make():
        return [torch.zeros(2), torch.zeros(2)], [torch.ones(2), torch.ones(2)]

    def call(d, s):
        with torch.inference_mode():
            torch._foreach_copy_(d, s)

    _assert_parity(*_both(make, call))


def test_pair_that_raises_midway_stops_the_writes_like_stock():
    q = torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8)
    _assert_parity(*_both(lambda: ([torch.zeros(4), torch.zeros(4), torch.zeros(4)], [torch.ones(4), q, torch.full((4,), 2.0)])))


def test_fake_tensor_mode_below_or_above_works_like_stock():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        d, s = [torch.empty(3)], [torch.ones(3)]
        with nd.NpuFastCopyMode():
            torch._foreach_copy_(d, s)
    with nd.NpuFastCopyMode():
        with FakeTensorMode():
            d, s = [torch.empty(3)], [torch.ones(3)]
            torch._foreach_copy_(d, s)
            assert d[0].shape == (3,)


@pytest.mark.parametrize("kwargs", [{}, {"strict": True}, {"verify": True}], ids=["mode", "strict", "verify"])
def test_functional_copy_into_expanded_destination_matches_stock(kwargs):
    # The interception kernel, and the debugging modes' Python handler, lay the outputs out as stock.
    def dsts():
        return [torch.zeros(1).expand(3), torch.zeros(2, 3).t()]

    srcs = [torch.arange(3.0), torch.randn(2, 3).t()]
    stock = torch.ops.aten._foreach_copy.default(dsts(), srcs)
    with nd.NpuFastCopyMode(**kwargs) as mode:
        ours = torch.ops.aten._foreach_copy.default(dsts(), srcs)
    assert [(o.stride(), o._version) for o in ours] == [(s.stride(), s._version) for s in stock]
    assert all(torch.equal(o, s) for o, s in zip(ours, stock))
    assert mode.stats.fast_calls["aten._foreach_copy"] == 1, mode.stats.report()


def test_parameters_take_the_fast_path():
    params = [torch.nn.Parameter(torch.zeros(4), requires_grad=False) for _ in range(3)]
    mode = nd.NpuFastCopyMode(strict=True)
    with mode:
        torch._foreach_copy_(params, [torch.ones(4)] * 3)
    assert all(torch.equal(p, torch.ones(4)) for p in params)
    assert mode.stats.fast_calls["aten._foreach_copy_"] == 1


def test_nested_tensors_raise_like_stock():
    nt = lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])  # noqa: E731
    _assert_parity(*_nested_errors(nt))


def _nested_errors(nt):
    out = []
    for use_mode in (False, True):
        d, s = [nt()], [nt()]
        try:
            if use_mode:
                with nd.NpuFastCopyMode():
                    torch._foreach_copy_(d, s)
            else:
                torch._foreach_copy_(d, s)
            err = None
        except Exception as e:
            err = (type(e), str(e))
        out.append((err, [], []))
    return out


def test_cpu_cross_dtype_nan_payloads_match_stock_in_adjacent_runs():
    # Every 16-bit pattern (all fp16 / bf16 NaN payloads among them) through adjacent short pairs:
    # stock's CPU result for a NaN can depend on where a copy ends, so runs must not change it.
    pats = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    for sdt, ddt in [(torch.float16, f32), (bf16, f32), (f32, bf16), (torch.float64, bf16), (f32, torch.float16)]:
        if sdt.itemsize == 2:
            src = pats.view(sdt)
        else:
            src = torch.randint(-(2**31), 2**31 - 1, (65536 * sdt.itemsize // 4,), dtype=torch.int32,
                                generator=torch.Generator().manual_seed(0)).view(sdt)
            src[::7] = float("nan")
            src.view(torch.int32 if sdt.itemsize == 4 else torch.int64)[1::7] |= 0x7F800001 if sdt.itemsize == 4 else 0x7FF0000000000001
        for piece in (1, 3, 9, 17):
            n = src.numel() // piece * piece
            d0 = torch.zeros(n, dtype=ddt)
            d1 = torch.zeros(n, dtype=ddt)
            torch._foreach_copy_(list(d0.split(piece)), list(src[:n].split(piece)))
            with nd.NpuFastCopyMode():
                torch._foreach_copy_(list(d1.split(piece)), list(src[:n].split(piece)))
            assert torch.equal(bits(d0), bits(d1)), (sdt, ddt, piece)


def test_cpu_zero_dim_cross_dtype_nan_matches_stock():
    def make():
        buf = torch.zeros(4, dtype=bf16)
        src = torch.full((4,), float("nan"))
        return [buf[k] for k in range(4)], [src[k] for k in range(4)]

    _assert_parity(*_both(make))


def test_inference_tensor_destination_outside_inference_mode_raises_like_stock():
    def make():
        with torch.inference_mode():
            d0 = torch.zeros(3)
        return [torch.zeros(2), d0, torch.zeros(4)], [torch.ones(2), torch.ones(3), torch.ones(4)]

    _assert_parity(*_both(make))
    _assert_parity(*_both(make, lambda d, s: nd.foreach_copy_(d, s)))


def test_stats_say_which_op_took_which_path_and_the_totals_add_up():
    import torch.distributed.fsdp  # noqa: F401  registers fsdp::all_gather_copy_in

    mode = nd.NpuFastCopyMode()
    out = torch.zeros(2 * 10)
    with mode:
        torch._foreach_copy_([torch.zeros(3), torch.zeros(2, 2).t()], [torch.ones(3), torch.ones(2, 2)])
        torch.ops.fsdp.all_gather_copy_in([torch.ones(4), torch.ones(6)], out, [4, 6], 10, 1)
    d = mode.stats.as_dict()
    foreach, copy_in = d["ops"]["aten._foreach_copy_"], d["ops"]["fsdp.all_gather_copy_in"]
    assert foreach["paths"] == {"foreach": {"calls": 1, "pairs": 1, "bytes": 12, "launches": 1},
                                "fallback": {"calls": 1, "pairs": 1, "bytes": 16, "launches": 1}}
    assert foreach["fallbacks"] == {"strides": {"pairs": 1, "calls": 1}}
    assert copy_in["paths"] == {"foreach": {"calls": 1, "pairs": 2, "bytes": 40, "launches": 1}}
    assert copy_in["fallbacks"] == {}
    for path, total in d["paths"].items():
        assert total["pairs"] == sum(v["paths"].get(path, {}).get("pairs", 0) for v in d["ops"].values())
    assert d["fallbacks"] == {"strides": {"pairs": 1, "calls": 1}}


@pytest.mark.parametrize("op", ["foreach_copy_", "copy_out", "chunk_cat"])
def test_the_debugging_modes_passthrough_counts_as_the_interception_counts(op):
    # Another dispatch mode on the stack at the call: the debugging mode hands it to stock whole and
    # counts it as the C++ interception counts a passthrough: its first tensor list's pairs (the
    # copy-out's out, not its int sizes), one launch each, the bytes its schema writes, under a
    # reason C++ lists.
    if not _native.available():
        pytest.skip("the debugging mode's passthrough counts are the native library's")
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  registers fsdp::

    src = torch.arange(24.0).view(2, 12)
    outs = [torch.zeros(2, 2), torch.zeros(2, 4), torch.zeros(2, 6)]
    mode = nd.NpuFastCopyMode(verify=True)
    cat_out = torch.zeros(2, 1, 12, dtype=torch.float64)  # chunk_cat writes out, not its first list
    with mode, _Passthrough():
        if op == "copy_out":
            torch.ops.fsdp.split_with_sizes_copy(src, [2, 4, 6], dim=1, out=outs)
        elif op == "chunk_cat":
            torch.ops.fsdp.chunk_cat([torch.ones(2, 2), torch.ones(2, 4), torch.ones(2, 6)], 1, 1, out=cat_out)
        else:
            torch._foreach_copy_(outs, [torch.ones(2, 2), torch.ones(2, 4), torch.ones(2, 6)])
    d = mode.stats.as_dict()
    assert d["fallback_reasons"] == {"dispatch_mode": 3}
    written = cat_out.nbytes if op == "chunk_cat" else sum(o.nbytes for o in outs)
    assert d["paths"]["stock"] == {"calls": 1, "pairs": 3, "tensors": 3, "bytes": written, "launches": 3}
    if op == "chunk_cat":
        assert torch.equal(cat_out, torch.ones(2, 1, 12, dtype=torch.float64))
        return
    assert "dispatch_mode" in _native.module().names()["kinds"]
    want = list(src.split([2, 4, 6], dim=1)) if op == "copy_out" else [torch.ones_like(o) for o in outs]
    assert all(torch.equal(o, w) for o, w in zip(outs, want))


def test_a_wrapper_subclass_is_counted_by_its_inner_copies_in_both_modes():
    # A wrapper subclass unwraps itself and its plain-tensor copies come back: the debugging mode
    # counts those, as the C++ interception does, not the wrapper's call as well.
    if not _native.available():
        pytest.skip("the debugging mode's counts are the native library's")
    counted = []
    for verify in (False, True):
        a, b = TwoTensor(torch.zeros(6), torch.zeros(6)), TwoTensor(torch.ones(6), torch.full((6,), 2.0))
        mode = nd.NpuFastCopyMode(verify=verify)
        with mode:
            torch._foreach_copy_([a], [b])
        assert torch.equal(a.a, b.a) and torch.equal(a.b, b.b)
        d = mode.stats.as_dict()
        counted.append(({op: v["calls"] for op, v in d["ops"].items()}, d["fallback_reasons"], d["paths"]))
    assert counted[0] == counted[1] and counted[1][0] == {"aten._foreach_copy_": 2} and counted[1][1] == {}
