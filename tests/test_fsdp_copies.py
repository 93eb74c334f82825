"""FSDP2's all-gather copy-out (fsdp.split_with_sizes_copy, and aten's split_with_sizes_copy.out
that it calls) and reduce-scatter copy-in
(fsdp.chunk_cat) on the fast path: bitwise against stock (NaN payloads, -0.0, padding), dims,
world sizes, empty shards, errors and partial writes, resize warnings, version counters, through
the direct ops, the mode's interception and its debugging modes."""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  registers fsdp::
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_dispatch as nd
from npu_dispatch import _native

pytestmark = pytest.mark.skipif(not _native.available(), reason="native library not built")

f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
fsdp = torch.ops.fsdp


def _values(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random values with NaN payloads, infinities and signed zeros."""
    x = torch.randn(n, generator=gen)
    if n:
        bits = x.view(torch.int32)
        bits[:: 5] = 0x7FA00001  # signalling NaN with a payload
        bits[1:: 7] = -0x80000000  # -0.0 (the sign bit alone)
        bits[2:: 11] = 0x7F800000
    return x.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    c = t.contiguous()
    return c.view(torch.uint8) if c.numel() else c


def _same(a, b) -> bool:
    return all(x.shape == y.shape and torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b))


# ---- copy-out ---------------------------------------------------------------------------------

def _copy_out_case(world, sizes, dtype, seed):
    """FSDP2's call: the all-gather output viewed (world, -1), one (world, size) out per shard."""
    gen = torch.Generator().manual_seed(seed)
    src = _values(world * sum(sizes), dtype, gen).view(world, sum(sizes))
    return src, lambda: [torch.full((world, s), 7, dtype=dtype) for s in sizes]


def _run_copy_out(fn, src, sizes, dim, make_out):
    out = make_out()
    before = [o._version for o in out]
    fn(src, sizes, dim, out)
    return out, [o._version - b for o, b in zip(out, before)]


def stock_copy_out(src, sizes, dim, out):
    fsdp.split_with_sizes_copy(src, sizes, dim=dim, out=out)


def stock_aten_copy_out(src, sizes, dim, out):
    torch.split_with_sizes_copy(src, sizes, dim, out=out)


def mode_copy_out(src, sizes, dim, out):
    with nd.NpuFastCopyMode():
        fsdp.split_with_sizes_copy(src, sizes, dim=dim, out=out)


def aten_copy_out(src, sizes, dim, out):
    with nd.NpuFastCopyMode():
        torch.split_with_sizes_copy(src, sizes, dim, out=out)


def direct_copy_out(src, sizes, dim, out):
    nd.split_with_sizes_copy(src, sizes, dim, out=out)


def op_copy_out(src, sizes, dim, out):
    torch.ops.npu_dispatch.split_with_sizes_copy(src, sizes, dim, out=out)


COPY_OUT = (mode_copy_out, aten_copy_out, direct_copy_out, op_copy_out)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.lists(st.integers(0, 300), min_size=1, max_size=12),
       st.sampled_from([f32, bf16, f16, torch.int32]), st.integers(0, 5))
def test_copy_out_matches_stock_bitwise_with_versions(world, sizes, dtype, seed):
    src, make_out = _copy_out_case(world, sizes, dtype, seed)
    want, want_v = _run_copy_out(stock_copy_out, src, sizes, 1, make_out)
    for fn in COPY_OUT:
        got, got_v = _run_copy_out(fn, src, sizes, 1, make_out)
        assert _same(got, want) and got_v == want_v, fn.__name__


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_copy_out_splits_any_dim_as_stock(dim):
    gen = torch.Generator().manual_seed(0)
    src = _values(4 * 6 * 5, f32, gen).view(4, 6, 5)
    n = src.size(dim)
    sizes = [1, n - 3, 0, 2] if n >= 3 else [n]
    shape = lambda s: [s if k == dim % 3 else src.size(k) for k in range(3)]  # noqa: E731
    make_out = lambda: [torch.zeros(shape(s)) for s in sizes]  # noqa: E731
    want, want_v = _run_copy_out(stock_copy_out, src, sizes, dim, make_out)
    for fn in COPY_OUT:
        got, got_v = _run_copy_out(fn, src, sizes, dim, make_out)
        assert _same(got, want) and got_v == want_v, (fn.__name__, dim)


@pytest.mark.parametrize("threads", [2, 1])
@pytest.mark.parametrize("world,adjacent", [(8, False), (1, False), (1, True), (3, True)])
def test_a_long_copy_out_matches_stock_on_every_call_and_thread_count(world, adjacent, threads):
    """Megabytes of odd-sized shards: the pass splits src's bytes across threads at any element
    and alternates its direction from call to call, so three calls in a row from fresh outs must
    each give stock's bytes. ``adjacent``: the outs are back-to-back views of one buffer (a world
    of one copies them as one run)."""
    sizes = [1 + (i * 389) % 4099 for i in range(60)]
    src, _ = _copy_out_case(world, sizes, bf16, 3)
    # The outs start as a negative NaN, 0xffc1: neither of its bytes is likely in src, so a byte
    # left unwritten shows.
    fill = lambda n: torch.full((n,), -63, dtype=torch.int16).view(bf16)  # noqa: E731
    if adjacent:
        def make_out():
            flat = fill(world * sum(sizes))
            return [p.view(world, s) for p, s in zip(flat.split([world * s for s in sizes]), sizes)]
    else:
        def make_out():
            return [fill(world * s).view(world, s) for s in sizes]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        want, want_v = _run_copy_out(stock_copy_out, src, sizes, 1, make_out)
        for fn in COPY_OUT:
            for call in range(3):
                with nd.NpuFastCopyMode() as mode:
                    got, got_v = _run_copy_out(_under_this_mode(fn), src, sizes, 1, make_out)
                assert _same(got, want) and got_v == want_v, (fn.__name__, call)
                assert _fast_calls(mode) == 1, fn.__name__
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("op", ["fsdp.split_with_sizes_copy", "aten.split_with_sizes_copy.out"])
def test_the_copy_out_takes_the_fast_path_in_the_mode(op):
    src, make_out = _copy_out_case(8, [300, 17, 0, 1024], bf16, 1)
    out = make_out()
    with nd.NpuFastCopyMode() as mode:
        if op.startswith("fsdp"):
            fsdp.split_with_sizes_copy(src, [300, 17, 0, 1024], dim=1, out=out)
        else:
            torch.split_with_sizes_copy(src, [300, 17, 0, 1024], 1, out=out)
    ops = mode.stats.as_dict()["ops"]
    assert set(ops) == {op}
    paths = ops[op]["paths"]
    assert paths["foreach"]["pairs"] == 8 * 3 and paths["foreach"]["launches"] == 1
    assert mode.stats.total_fallback_calls == 0
    assert _same(out, [s.contiguous() for s in src.split([300, 17, 0, 1024], 1)])


def test_a_copy_out_fsdp_leaves_to_stock_is_counted_once_under_fsdps_op():
    """FSDP's own kernel for a refused call calls aten::split_with_sizes_copy.out, itself an owned
    op: the call is counted once, under the op the caller made."""
    src, _ = _copy_out_case(4, [10, 20], f32, 0)
    strided = [torch.zeros(4, 20)[:, :10], torch.zeros(4, 20)]
    want = [o.clone() for o in strided]
    torch.split_with_sizes_copy(src, [10, 20], 1, out=want)
    with nd.NpuFastCopyMode() as mode:
        fsdp.split_with_sizes_copy(src, [10, 20], dim=1, out=strided)
    ops = mode.stats.as_dict()["ops"]
    assert set(ops) == {"fsdp.split_with_sizes_copy"} and ops["fsdp.split_with_sizes_copy"]["calls"] == 1
    assert ops["fsdp.split_with_sizes_copy"]["fallback_calls"] == 1
    assert _same(strided, want)


def _bad_copy_out_cases():
    src = torch.arange(24.0).view(2, 12)
    ok = lambda: [torch.zeros(2, 5), torch.zeros(2, 7)]  # noqa: E731
    return {
        "sizes_do_not_sum": (src, [5, 6], 1, ok),
        "wrong_count": (src, [5, 7], 1, lambda: [torch.zeros(2, 5)]),
        "second_out_wrong_dtype": (src, [5, 7], 1, lambda: [torch.zeros(2, 5), torch.zeros(2, 7, dtype=bf16)]),
        "bad_dim": (src, [5, 7], 3, ok),
        "negative_size": (src, [-1, 13], 1, ok),
    }


@pytest.mark.parametrize("name", sorted(_bad_copy_out_cases()))
def test_copy_out_bad_input_raises_as_stock_after_the_same_writes(name):
    src, sizes, dim, make_out = _bad_copy_out_cases()[name]
    results = []
    for fn in (stock_copy_out, *COPY_OUT):
        out = make_out()
        with pytest.raises(Exception) as info:
            fn(src, sizes, dim, out)
        results.append((type(info.value), str(info.value).split("\n")[0], [o.clone() for o in out]))
    for fn, r in zip(COPY_OUT, results[1:]):
        assert r[:2] == results[0][:2] and _same(r[2], results[0][2]), fn.__name__


def test_copy_out_resizes_a_wrongly_shaped_out_with_stocks_warning():
    src = torch.arange(24.0).view(2, 12)
    got = []
    for fn in (stock_copy_out, *COPY_OUT):
        out = [torch.zeros(3), torch.zeros(2, 7)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(src, [5, 7], 1, out)
        got.append(([str(w.message).split(".")[0] for w in caught if issubclass(w.category, UserWarning)], out))
    for fn, (msgs, out) in zip(COPY_OUT, got[1:]):
        assert msgs == got[0][0] and msgs, fn.__name__
        assert _same(out, got[0][1]), fn.__name__


def test_copy_out_overlapping_out_goes_to_stock_with_its_result():
    for fn in (stock_copy_out, *COPY_OUT):
        src = torch.arange(24.0).view(2, 12)
        out = [src[:, :5].contiguous(), src.view(-1)[:14].view(2, 7)]  # the second aliases src
        fn(src, [5, 7], 1, out)
        if fn is stock_copy_out:
            want = [o.clone() for o in out]
        else:
            assert _same(out, want), fn.__name__


# ---- chunk_cat --------------------------------------------------------------------------------

def _chunk_cat_case(shapes, dtype, out_dtype, world, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    tensors = [_values(int(torch.tensor(s).prod().item()), dtype, gen).view(s) for s in shapes]
    stock_out = torch._chunk_cat(tensors, dim, world).to(out_dtype)
    return tensors, lambda: torch.full(stock_out.shape, 7, dtype=out_dtype)


def stock_chunk_cat(tensors, dim, n, out):
    fsdp.chunk_cat(tensors, dim, n, out=out)


def mode_chunk_cat(tensors, dim, n, out):
    with nd.NpuFastCopyMode():
        fsdp.chunk_cat(tensors, dim, n, out=out)


def direct_chunk_cat(tensors, dim, n, out):
    nd.chunk_cat(tensors, dim, n, out=out)


def op_chunk_cat(tensors, dim, n, out):
    torch.ops.npu_dispatch.chunk_cat(tensors, dim, n, out=out)


CHUNK_CAT = (mode_chunk_cat, direct_chunk_cat, op_chunk_cat)


def _under_this_mode(fn):
    """The call to make inside a test's own NpuFastCopyMode: a mode variant's stock call (its own
    inner mode would count the call where the test's stats cannot see it), else fn."""
    return {mode_copy_out: stock_copy_out, aten_copy_out: stock_aten_copy_out,
            mode_chunk_cat: stock_chunk_cat}.get(fn, fn)


def _fast_calls(mode) -> int:
    """Calls the mode's stats count as served on the fast path, over every op."""
    return sum(op["fast_calls"] for op in mode.stats.as_dict()["ops"].values())


def _run_chunk_cat(fn, tensors, dim, n, make_out):
    out = make_out()
    before = out._version
    fn(tensors, dim, n, out)
    return out, out._version - before


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.lists(st.tuples(st.integers(1, 70), st.integers(1, 4)), min_size=1, max_size=10),
       st.sampled_from([(bf16, f32), (f32, f32), (bf16, bf16), (f32, bf16), (f16, f16)]), st.booleans(),
       st.integers(0, 5))
def test_chunk_cat_matches_stock_bitwise_with_padding_and_versions(world, dims, dtypes, two_d, seed):
    shapes = [(a, b) if two_d else (a * b,) for a, b in dims]
    tensors, make_out = _chunk_cat_case(shapes, dtypes[0], dtypes[1], world, 0, seed)
    want, want_v = _run_chunk_cat(stock_chunk_cat, tensors, 0, world, make_out)
    for fn in CHUNK_CAT:
        got, got_v = _run_chunk_cat(fn, tensors, 0, world, make_out)
        assert _same([got], [want]) and got_v == want_v, fn.__name__


@pytest.mark.parametrize("dim", [1, 2, -1])
def test_chunk_cat_chunks_any_dim_as_stock(dim):
    shapes = [(3, 5, 7), (3, 5, 3)] if dim != 1 else [(3, 5, 7), (3, 2, 4), (3, 9, 1)]
    tensors, make_out = _chunk_cat_case(shapes, bf16, f32, 4, dim, 3)
    want, _ = _run_chunk_cat(stock_chunk_cat, tensors, dim, 4, make_out)
    for fn in CHUNK_CAT:
        got, _ = _run_chunk_cat(fn, tensors, dim, 4, make_out)
        assert _same([got], [want]), (fn.__name__, dim)


def test_fsdp_chunk_cat_takes_the_fast_path_in_the_mode():
    tensors, make_out = _chunk_cat_case([(37,), (64, 3), (5, 2)], bf16, f32, 8, 0, 2)
    out = make_out()
    with nd.NpuFastCopyMode() as mode:
        fsdp.chunk_cat(tensors, 0, 8, out=out)
    paths = mode.stats.as_dict()["ops"]["fsdp.chunk_cat"]["paths"]
    assert paths["foreach"]["calls"] == 1 and paths["foreach"]["launches"] == 1
    assert mode.stats.total_fallback_calls == 0


def _bad_chunk_cat_cases():
    ok_out = lambda: torch.zeros(2, 8)  # noqa: E731
    return {
        "empty_list": ([], 0, 2, ok_out),
        "zero_chunks": ([torch.ones(4)], 0, 0, ok_out),
        "empty_tensor": ([torch.ones(4), torch.ones(0)], 0, 2, ok_out),
        "two_dtypes": ([torch.ones(4), torch.ones(4, dtype=bf16)], 0, 2, ok_out),
        "leading_dims_differ": ([torch.ones(2, 4), torch.ones(3, 4)], 1, 2, ok_out),
        "dim_out_of_range": ([torch.ones(4)], 2, 2, ok_out),
        "float_into_an_int_out": ([torch.ones(4)], 0, 2, lambda: torch.zeros(2, 2, dtype=torch.int64)),
        "negative_dim_over_mixed_ndims": ([torch.ones(4, 3), torch.ones(4, 3, 2)], -1, 2, lambda: torch.zeros(4, 2, 6)),
        "out_aliases_an_input": None,  # built below: out is a view of the input
    }


def _aliased_chunk_cat_case(numel=8):
    """An out whose elements hold part of the input (cat_out raises where no padding copies it)."""
    buf = torch.arange(16.0)
    return [buf[:numel]], 0, 2, lambda: buf[4:12].view(2, 4)


@pytest.mark.parametrize("name", sorted(_bad_chunk_cat_cases()))
def test_chunk_cat_bad_input_raises_as_stock(name):
    case = _bad_chunk_cat_cases()[name]
    tensors, dim, n, make_out = case if case is not None else _aliased_chunk_cat_case()
    results = []
    for fn in (stock_chunk_cat, *CHUNK_CAT):
        out = make_out()
        with pytest.raises(Exception) as info:
            fn(tensors, dim, n, out)
        results.append((type(info.value), str(info.value).split("\n")[0], out.clone()))
    for fn, r in zip(CHUNK_CAT, results[1:]):
        assert r[:2] == results[0][:2] and torch.equal(_bits(r[2]), _bits(results[0][2])), fn.__name__


def test_chunk_cat_into_an_out_overlapping_a_padded_input_gets_stocks_result():
    results = []
    for fn in (stock_chunk_cat, *CHUNK_CAT):
        tensors, dim, n, make_out = _aliased_chunk_cat_case(numel=7)
        fn(tensors, dim, n, make_out())
        results.append(tensors[0]._base.clone())
    for fn, r in zip(CHUNK_CAT, results[1:]):
        assert torch.equal(_bits(r), _bits(results[0])), fn.__name__


def test_chunk_cat_of_gradients_that_require_grad_is_served_under_no_grad():
    tensors, make_out = _chunk_cat_case([(37,), (16, 3)], bf16, f32, 8, 0, 6)
    tensors = [t.requires_grad_() for t in tensors]
    want, want_v = _run_chunk_cat(stock_chunk_cat, tensors, 0, 8, make_out)
    with torch.no_grad():
        for fn in CHUNK_CAT:
            with nd.NpuFastCopyMode() as mode:
                got, got_v = _run_chunk_cat(_under_this_mode(fn), tensors, 0, 8, make_out)
            assert _same([got], [want]) and got_v == want_v, fn.__name__
            assert _fast_calls(mode) == 1, fn.__name__


def test_a_refused_chunk_cat_leaves_a_copy_on_write_out_as_stock_does():
    tensors = [torch.ones(5), torch.ones(5, dtype=torch.float64)]  # two dtypes: stock raises
    for fn in (stock_chunk_cat, *CHUNK_CAT):
        out = torch._lazy_clone(torch.zeros(2, 3))
        with pytest.raises(RuntimeError):
            fn(tensors, 0, 2, out)
        assert torch._C._is_cow_tensor(out), fn.__name__


def test_chunk_cat_mixes_ndims_under_a_non_negative_dim_as_stock():
    for shapes, dim in (([(37, 3), (37,), (37, 2, 2)], 0), ([(4, 3), (4, 3, 2), (4, 5)], 1)):
        tensors, make_out = _chunk_cat_case(shapes, bf16, f32, 4, dim, 5)
        want, _ = _run_chunk_cat(stock_chunk_cat, tensors, dim, 4, make_out)
        for fn in CHUNK_CAT:
            got, _ = _run_chunk_cat(fn, tensors, dim, 4, make_out)
            assert _same([got], [want]), (fn.__name__, dim)


def test_chunk_cat_reads_a_tensor_listed_twice_on_the_fast_path():
    # Inputs are only read: one tensor twice (or two overlapping views) is no aliasing of out.
    base = _values(40, bf16, torch.Generator().manual_seed(4))
    tensors = [base, base[3:30], base, base[:7]]
    want = torch.full(torch._chunk_cat(tensors, 0, 3).shape, 7.0)
    stock_chunk_cat(tensors, 0, 3, want)
    for fn in CHUNK_CAT:
        out = torch.full(want.shape, 7.0)
        with nd.NpuFastCopyMode() as mode:
            _under_this_mode(fn)(tensors, 0, 3, out)
        assert _same([out], [want]), fn.__name__
        assert _fast_calls(mode) == 1, (fn.__name__, mode.stats.as_dict()["ops"])


def test_chunk_cat_resizes_a_wrongly_shaped_out_with_stocks_warning():
    tensors = [torch.arange(5.0), torch.arange(3.0)]
    got = []
    for fn in (stock_chunk_cat, *CHUNK_CAT):
        out = torch.zeros(3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(tensors, 0, 2, out)
        got.append(([str(w.message).split(".")[0] for w in caught if issubclass(w.category, UserWarning)], out))
    for fn, (msgs, out) in zip(CHUNK_CAT, got[1:]):
        assert msgs == got[0][0] and msgs, fn.__name__
        assert _same([out], [got[0][1]]), fn.__name__


# ---- the debugging modes, opcheck -------------------------------------------------------------

def test_strict_and_verify_serve_both_ops_and_strict_names_a_fallback():
    src, make_out = _copy_out_case(4, [10, 20], bf16, 0)
    tensors, make_cc = _chunk_cat_case([(9,), (30,)], bf16, f32, 4, 0, 0)
    with nd.NpuFastCopyMode(strict=True, verify=True) as mode:
        fsdp.split_with_sizes_copy(src, [10, 20], dim=1, out=make_out())
        torch.split_with_sizes_copy(src, [10, 20], 1, out=make_out())
        fsdp.chunk_cat(tensors, 0, 4, out=make_cc())
    ops = mode.stats.as_dict()["ops"]
    assert ops["fsdp.split_with_sizes_copy"]["fast_calls"] == 1 and ops["fsdp.chunk_cat"]["fast_calls"] == 1
    assert ops["aten.split_with_sizes_copy.out"]["fast_calls"] == 1
    strided = [torch.zeros(4, 20)[:, :10], torch.zeros(4, 20)]
    with pytest.raises(nd.FastCopyFallbackError, match="fsdp.split_with_sizes_copy falls back"):
        with nd.NpuFastCopyMode(strict=True):
            fsdp.split_with_sizes_copy(src, [10, 20], dim=1, out=strided)
    assert not strided[0].any() and not strided[1].any()  # nothing written


def test_verify_inside_a_default_mode_counts_its_references_nowhere():
    """verify's stock reference calls aten::split_with_sizes_copy.out, an owned op: the default
    mode outside sees none of it, and the inner mode counts each call once."""
    src, make_out = _copy_out_case(4, [10, 20], f32, 0)
    with nd.NpuFastCopyMode() as outer:
        with nd.NpuFastCopyMode(verify=True) as inner:
            torch.split_with_sizes_copy(src, [10, 20], 1, out=make_out())
            fsdp.split_with_sizes_copy(src, [10, 20], dim=1, out=make_out())
            fsdp.split_with_sizes_copy(src, [10, 20], dim=1, out=[torch.zeros(4, 20)[:, :10], torch.zeros(4, 20)])
    assert outer.stats.as_dict()["ops"] == {}
    calls = {k: (v["calls"], v["fast_calls"]) for k, v in inner.stats.as_dict()["ops"].items()}
    assert calls == {"aten.split_with_sizes_copy.out": (1, 1), "fsdp.split_with_sizes_copy": (2, 1)}


def test_opcheck_passes_for_both_ops():
    src, make_out = _copy_out_case(2, [3, 4], f32, 0)
    torch.library.opcheck(torch.ops.npu_dispatch.split_with_sizes_copy.default, (src, [3, 4], 1),
                          {"out": make_out()})
    tensors, make_cc = _chunk_cat_case([(5,), (2, 3)], bf16, f32, 2, 0, 0)
    torch.library.opcheck(torch.ops.npu_dispatch.chunk_cat.default, (tensors, 0, 2), {"out": make_cc()})


def test_fake_tensors_trace_both_ops_with_stocks_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        src = torch.empty(2, 12)
        out = [torch.empty(2, 5), torch.empty(2, 7)]
        torch.ops.npu_dispatch.split_with_sizes_copy(src, [5, 7], 1, out=out)
        cc = torch.empty(2, 4)
        torch.ops.npu_dispatch.chunk_cat([torch.empty(5), torch.empty(3)], 0, 2, out=cc)
    assert [tuple(o.shape) for o in out] == [(2, 5), (2, 7)] and tuple(cc.shape) == (2, 5)


# ---- review findings: autograd, versions under the debugging modes, casts, subclasses, stats ----

def test_chunk_cat_into_an_out_that_requires_grad_raises_as_stock():
    tensors = [torch.ones(4), torch.ones(3)]
    errors = []
    for fn in (stock_chunk_cat, *CHUNK_CAT):
        out = torch.zeros(2, 4, requires_grad=True)
        with pytest.raises(RuntimeError) as info:
            fn(tensors, 0, 2, out)
        errors.append(str(info.value).split("\n")[0])
    assert len(set(errors)) == 1 and "automatic differentiation" in errors[0]


@pytest.mark.parametrize("debug", [{"strict": True}, {"verify": True}])
def test_version_counters_move_as_stock_under_the_debugging_modes(debug):
    src, make_out = _copy_out_case(2, [3, 4], f32, 0)
    tensors, make_cc = _chunk_cat_case([(5,), (3,)], bf16, f32, 2, 0, 0)
    for ctx in (None, debug):
        out, cc = make_out(), make_cc()
        aten_out = make_out()
        with (nd.NpuFastCopyMode(**ctx) if ctx else torch.no_grad()):
            fsdp.split_with_sizes_copy(src, [3, 4], dim=1, out=out)
            torch.split_with_sizes_copy(src, [3, 4], 1, out=aten_out)
            fsdp.chunk_cat(tensors, 0, 2, out=cc)
        got = ([o._version for o in out], [o._version for o in aten_out], cc._version)
        if ctx is None:
            want = got
    assert got == want == ([1, 1], [1, 1], 1)


def test_chunk_cat_casts_that_are_not_widening_stay_stocks():
    for out_dtype in (torch.int32, torch.int64, bf16):
        tensors = [torch.tensor([1.5, -2.5, 3.0])]
        results = []
        for fn in (stock_chunk_cat, *CHUNK_CAT):
            out = torch.zeros(1, 3, dtype=out_dtype)
            try:
                fn(tensors, 0, 1, out)
                results.append(("ok", out.clone()))
            except Exception as e:  # noqa: BLE001  compared with stock's
                results.append((type(e), str(e).split("\n")[0]))
        for fn, r in zip(CHUNK_CAT, results[1:]):
            assert r[0] == results[0][0], (fn.__name__, out_dtype)
            if r[0] == "ok":
                assert torch.equal(_bits(r[1]), _bits(results[0][1]))
            else:
                assert r == results[0]


def test_direct_functions_let_a_subclass_see_the_call():
    seen = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    src = torch.arange(12.0).view(2, 6).as_subclass(Logged)
    nd.split_with_sizes_copy(src, [2, 4], 1, out=[torch.zeros(2, 2), torch.zeros(2, 4)])
    nd.chunk_cat([torch.ones(3).as_subclass(Logged)], 0, 1, out=torch.zeros(1, 3))
    assert len(seen) >= 2


def test_a_dim_too_large_for_int64_raises_as_stock_and_writes_nothing():
    src = torch.arange(24.0).view(2, 12)
    for fn in (stock_copy_out, direct_copy_out):
        out = [torch.zeros(2, 5), torch.zeros(2, 7)]
        with pytest.raises(RuntimeError):
            fn(src, [5, 7], 2 ** 70, out)
        assert not out[0].any() and not out[1].any(), fn.__name__


def test_the_ops_count_in_the_mode_they_run_in():
    src, make_out = _copy_out_case(2, [3, 4], f32, 0)
    with nd.NpuFastCopyMode() as mode:
        torch.ops.npu_dispatch.split_with_sizes_copy(src, [3, 4], 1, out=make_out())
        nd.chunk_cat([torch.ones(3)], 0, 1, out=torch.zeros(1, 3))
    ops = mode.stats.as_dict()["ops"]
    assert ops["npu_dispatch.split_with_sizes_copy"]["calls"] == 1 and ops["npu_dispatch.chunk_cat"]["calls"] == 1


# ---- long lists: a pass split across threads --------------------------------------------------
# A list whose pass is long enough for two threads (csrc/cpu/byte_pass.h). A tensor refused in
# either half, or in the middle, must leave the call to stock whole: its error, its writes, its result.

LONG = 240  # gradients of 256..1023 elements: out is well over the serial pass's size


def _long_chunk_cat(defect, index, dtype=bf16):
    """A fresh long list and out (deterministic), with `defect` at tensors[index]."""
    gen = torch.Generator().manual_seed(index + 1)
    sizes = [256 + (k * 389) % 768 for k in range(LONG)]
    if defect == "aliased":  # dim-0 sizes a multiple of the world size: no padding copies the input
        sizes[index] = 64
    tensors = [_values(n, dtype, gen) for n in sizes]
    if defect == "empty":
        sizes[index] = 0
    # out of the shape the defective list's result would have: only the defect can refuse the call
    width = sum(-(-n // 8) for n in sizes)
    out = torch.full((8, width), 7.0, dtype=f32 if dtype == bf16 else dtype)
    if defect == "dtype":
        tensors[index] = tensors[index].to(f16)
    elif defect == "empty":
        tensors[index] = tensors[index][:0]
    elif defect == "strided":
        tensors[index] = _values(2 * sizes[index], dtype, gen)[::2]
    elif defect == "requires_grad":
        tensors[index] = tensors[index].float().requires_grad_().to(dtype)
    elif defect == "aliased":
        tensors[index] = out.view(-1)[1000:1064]
    elif defect == "ndim":
        tensors[index] = tensors[index].view(1, -1)
    return tensors, out


def _long_outcome(fn, defect, index, dtype=bf16):
    tensors, out = _long_chunk_cat(defect, index, dtype)
    before = out._version
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(tensors, -1 if defect == "ndim" else 0, 8, out)
        error = None
    except Exception as e:  # noqa: BLE001  compared with stock's below
        error = (type(e), str(e).split("\n")[0])
    return error, out.shape, _bits(out).clone(), out._version - before


@pytest.mark.parametrize("threads", [2, 1])
@pytest.mark.parametrize("index", [0, LONG // 2 - 1, LONG // 2, LONG - 1])
@pytest.mark.parametrize("defect", ["none", "dtype", "empty", "strided", "requires_grad", "aliased", "ndim"])
def test_a_long_list_refused_in_either_half_is_stocks_whole(defect, index, threads):
    dtype = f32 if defect == "aliased" else bf16
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        want = _long_outcome(stock_chunk_cat, defect, index, dtype)
        # Stock raises for these; it serves a strided tensor or one that requires grad (the pass
        # refuses both: stock's result).
        assert (want[0] is not None) == (defect in ("dtype", "empty", "aliased", "ndim")), want[0]
        for fn in CHUNK_CAT:
            with nd.NpuFastCopyMode() as mode:
                got = _long_outcome(_under_this_mode(fn), defect, index, dtype)
            assert got[0] == want[0] and got[1] == want[1], fn.__name__
            assert torch.equal(got[2], want[2]) and got[3] == want[3], fn.__name__
            if defect == "none":
                assert _fast_calls(mode) == 1, fn.__name__
    finally:
        torch.set_num_threads(old)


def test_a_long_list_into_an_out_of_the_wrong_width_is_resized_as_stock():
    results = []
    for fn in (stock_chunk_cat, *CHUNK_CAT):
        tensors, out = _long_chunk_cat("none", 0)
        out = out[:, :-3].contiguous()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(tensors, 0, 8, out)
        results.append((out.shape, _bits(out).clone(), [str(w.message) for w in caught]))
    for fn, r in zip(CHUNK_CAT, results[1:]):
        assert r[0] == results[0][0] and torch.equal(r[1], results[0][1]) and r[2] == results[0][2], fn.__name__


def test_a_long_refused_chunk_cat_leaves_a_copy_on_write_out_as_stock_does():
    for fn in (stock_chunk_cat, *CHUNK_CAT):
        tensors, out = _long_chunk_cat("dtype", LONG - 1)
        out = torch._lazy_clone(out)
        with pytest.raises(RuntimeError):
            fn(tensors, 0, 8, out)
        assert torch._C._is_cow_tensor(out), fn.__name__


@pytest.mark.parametrize("op", ["chunk_cat", "split_with_sizes_copy", "aten_split_with_sizes_copy"])
def test_a_call_left_to_stock_for_autograd_is_counted_as_requires_grad(op):
    # Stock serves an input that requires grad (its out does not) under grad mode; the fast
    # path leaves that call to stock and names the reason.
    def call(x, outs):
        if op == "chunk_cat":
            fsdp.chunk_cat([x, torch.ones(3)], 0, 2, out=outs[0])
        elif op == "aten_split_with_sizes_copy":
            torch.split_with_sizes_copy(x.view(2, 3), [1, 2], 1, out=outs)
        else:
            fsdp.split_with_sizes_copy(x.view(2, 3), [1, 2], dim=1, out=outs)

    def fresh():
        x = torch.arange(6.0, requires_grad=True)
        outs = [torch.zeros(2, 5)] if op == "chunk_cat" else [torch.zeros(2, 1), torch.zeros(2, 2)]
        return x, outs

    x, want = fresh()
    try:
        call(x, want)
        want_error = None
    except RuntimeError as e:
        want_error = str(e).split("\n")[0]
    x, got = fresh()
    with nd.NpuFastCopyMode() as mode:
        try:
            call(x, got)
            got_error = None
        except RuntimeError as e:
            got_error = str(e).split("\n")[0]
    assert got_error == want_error
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    if want_error is None:
        assert set(mode.stats.fallback_reasons) == {"requires_grad"}, mode.stats.report()
    with pytest.raises(nd.FastCopyFallbackError, match="requires_grad"):
        with nd.NpuFastCopyMode(strict=True):
            call(*fresh())


def _has_mixed_dtype_chunk_cat() -> bool:
    try:
        torch.ops.fsdp.chunk_cat_mixed_dtype
    except (AttributeError, RuntimeError):
        return False
    return True


@pytest.mark.skipif(not _has_mixed_dtype_chunk_cat(), reason="fsdp::chunk_cat_mixed_dtype is torch 2.15's")
def test_a_mixed_dtype_chunk_cat_counts_one_kernel_pass_over_out():
    # One pass of the kernel per input dtype, counted as one pass over out's bytes (bf16 and fp32
    # gradients into an fp32 reduce-scatter input, as FSDP2 on torch 2.15).
    gen = torch.Generator().manual_seed(7)
    tensors = [torch.randn(8, 3, generator=gen).bfloat16(), torch.randn(5, generator=gen),
               torch.randn(4, 2, generator=gen).bfloat16()]
    want = torch.full((2, 19), float("nan"))
    torch.ops.fsdp.chunk_cat_mixed_dtype(tensors, 0, 2, out=want)
    got = torch.full((2, 19), float("nan"))
    before = _native.info()
    with nd.NpuFastCopyMode() as mode:
        torch.ops.fsdp.chunk_cat_mixed_dtype(tensors, 0, 2, out=got)
    after = _native.info()
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert mode.stats.fast_path_calls == 1, mode.stats.report()
    assert after["kernel_passes"] - before["kernel_passes"] == 1
    assert after["kernel_bytes"] - before["kernel_bytes"] == got.nbytes
    assert after["kernel_items"] - before["kernel_items"] == 3 * 2  # a piece per tensor per chunk


@pytest.mark.skipif(not _has_mixed_dtype_chunk_cat(), reason="fsdp::chunk_cat_mixed_dtype is torch 2.15's")
@pytest.mark.parametrize("order", ["bbffbf", "ffbbbb", "bffffb"])
@pytest.mark.parametrize("num_chunks", [2, 3])
def test_mixed_dtype_runs_of_one_dtype_land_where_stock_puts_them(order, num_chunks):
    # Consecutive inputs of one dtype are checked as one run; each lands at its own offset of
    # every out row, with stock's bits (NaN payloads, -0.0 included).
    gen = torch.Generator().manual_seed(len(order) * num_chunks)
    tensors = []
    for k, c in enumerate(order):
        t = torch.randn(5 + 3 * k, 2, generator=gen)
        t.view(-1)[::7] = float("nan")
        t.view(-1)[1::11] = -0.0
        tensors.append(t.bfloat16() if c == "b" else t)
    width = sum(-(-t.shape[0] // num_chunks) * 2 for t in tensors)
    want = torch.full((num_chunks, width), 7.0)
    torch.ops.fsdp.chunk_cat_mixed_dtype(tensors, 0, num_chunks, out=want)
    got = torch.full((num_chunks, width), 7.0)
    before = _native.info()
    with nd.NpuFastCopyMode() as mode:
        torch.ops.fsdp.chunk_cat_mixed_dtype(tensors, 0, num_chunks, out=got)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert mode.stats.fast_path_calls == 1, mode.stats.report()
    assert _native.info()["kernel_passes"] - before["kernel_passes"] == 1


@pytest.mark.skipif(not _has_mixed_dtype_chunk_cat(), reason="fsdp::chunk_cat_mixed_dtype is torch 2.15's")
def test_a_refused_mixed_dtype_chunk_cat_under_verify_counts_once_in_the_inner_mode():
    # verify's reference and the refused call's stock op are both fsdp::chunk_cat_mixed_dtype, an
    # owned op: the default mode outside counts neither.
    gen = torch.Generator().manual_seed(3)
    tensors = [torch.randn(16, generator=gen).bfloat16()[::2], torch.randn(5, generator=gen)]  # strided: refused
    want = torch.full((2, 7), float("nan"))
    torch.ops.fsdp.chunk_cat_mixed_dtype(tensors, 0, 2, out=want)
    got = torch.full((2, 7), float("nan"))
    with nd.NpuFastCopyMode() as outer:
        with nd.NpuFastCopyMode(verify=True) as inner:
            torch.ops.fsdp.chunk_cat_mixed_dtype(tensors, 0, 2, out=got)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert outer.stats.as_dict()["ops"] == {}
    ops = inner.stats.as_dict()["ops"]
    assert set(ops) == {"fsdp.chunk_cat_mixed_dtype"} and ops["fsdp.chunk_cat_mixed_dtype"]["calls"] == 1
    assert ops["fsdp.chunk_cat_mixed_dtype"]["fallback_calls"] == 1


@pytest.mark.parametrize("cast", [(bf16, f32), (f32, bf16)], ids=["widening", "narrowing"])
@pytest.mark.parametrize("verify", [False, True], ids=["kernels", "debugging_mode"])
def test_on_a_device_without_a_host_pass_chunk_cat_stays_its_own_op_as_device_op(verify, cast):
    # A batching device's entry on CPU (no host pass): the copy-out's rows go to the planner, chunk_cat
    # to the device's own op (one call), counted under its own reason, whatever its cast.
    from npu_dispatch.capabilities import npu_capability, override

    tensors, make_out = _chunk_cat_case([(37,), (16, 3)], *cast, 8, 0, 6)
    want, want_v = _run_chunk_cat(stock_chunk_cat, tensors, 0, 8, make_out)
    src, make_outs = _copy_out_case(4, [5, 0, 9], f32, 1)
    want_out, want_out_v = _run_copy_out(stock_copy_out, src, [5, 0, 9], 1, make_outs)
    with override({"cpu": npu_capability("9.1.0")}):
        with nd.NpuFastCopyMode(verify=verify) as mode:
            got, got_v = _run_chunk_cat(stock_chunk_cat, tensors, 0, 8, make_out)
            got_out, got_out_v = _run_copy_out(stock_copy_out, src, [5, 0, 9], 1, make_outs)
    assert _same([got], [want]) and got_v == want_v
    assert _same(got_out, want_out) and got_out_v == want_out_v
    ops = mode.stats.as_dict()["ops"]
    assert ops["fsdp.chunk_cat"]["fast_calls"] == 0 and ops["fsdp.chunk_cat"]["fallback_calls"] == 1
    assert mode.stats.as_dict()["fallback_reasons"] == {"device_op": 2}
    assert ops["fsdp.split_with_sizes_copy"]["fast_calls"] == 1


def _inference_keyed_outs(*shapes):
    # Normal tensors given an inference tensor's .data: inference-keyed, yet they keep a counter.
    outs = []
    for shape in shapes:
        t = torch.zeros(*shape)
        with torch.inference_mode():
            t.data = torch.zeros(*shape)
        outs.append(t)
    return outs


@pytest.mark.parametrize("served", [True, False], ids=["served", "refused"])
@pytest.mark.parametrize("op,entry", [(op, entry) for op in ("copy_out", "chunk_cat")
                                      for entry in ("interception", "debugging_mode", "direct")]
                         + [("aten_copy_out", "debugging_mode")])
@pytest.mark.parametrize("inference_src", [True, False], ids=["inference_src", "normal_src"])
def test_inside_inference_mode_inference_keyed_outs_keep_their_versions_as_stock(op, entry, served, inference_src):
    # Inside inference_mode, a call whose tensors are all inference-keyed skips stock's
    # ADInplaceOrView kernel, so outs that still carry a counter keep their versions; outside it,
    # the same outs move, and so they do inside it where a source is a normal tensor (made outside
    # inference_mode). A served call bumps by the library's rule (planner/classify.h
    # stock_bumps); a refused one (a non-contiguous input) runs stock's op. aten's out= op has an
    # ADInplaceOrView kernel of its own, which alone moves the counters.
    def source(make):
        if not inference_src:
            return make()
        with torch.inference_mode():
            return make()

    def call(outs, inference, stock=False):
        if op.endswith("copy_out"):
            src = source(lambda: torch.arange(128.0).view(4, 32)[:, :16].contiguous() if served
                         else torch.arange(128.0).view(4, 32)[:, ::2])
        else:
            src = source(lambda: torch.arange(6.0) if served else torch.arange(12.0)[::2])
        ctx = torch.inference_mode() if inference else contextlib.nullcontext()
        with ctx:
            if op.endswith("copy_out"):
                if entry == "direct" and not stock:
                    nd.split_with_sizes_copy(src, [6, 10], 1, out=outs)
                elif op == "aten_copy_out":
                    torch.split_with_sizes_copy(src, [6, 10], 1, out=outs)
                else:
                    fsdp.split_with_sizes_copy(src, [6, 10], dim=1, out=outs)
            else:
                if entry == "direct" and not stock:
                    nd.chunk_cat([src], 0, 2, out=outs[0])
                else:
                    fsdp.chunk_cat([src], 0, 2, out=outs[0])

    shapes = [(4, 6), (4, 10)] if op.endswith("copy_out") else [(2, 3)]
    for inference in (True, False):
        results = []
        for under_mode in (False, True):
            outs = _inference_keyed_outs(*shapes)
            before = [t._version for t in outs]
            if not under_mode:
                call(outs, inference, stock=True)
            elif entry == "direct":
                nd.global_stats().reset()
                call(outs, inference)
                stats = nd.global_stats()
            else:
                with nd.NpuFastCopyMode(verify=entry == "debugging_mode") as mode:
                    call(outs, inference)
                stats = mode.stats
            results.append(([t._version - b for t, b in zip(outs, before)], [_bits(t).tolist() for t in outs]))
        assert results[1] == results[0]
        assert results[0][0] == ([0] * len(shapes) if inference and inference_src else [1] * len(shapes))
        ops = stats.as_dict()["ops"]
        name = {"copy_out": "fsdp.split_with_sizes_copy", "chunk_cat": "fsdp.chunk_cat",
                "aten_copy_out": "aten.split_with_sizes_copy.out"}[op]
        name = name.replace("fsdp.", "npu_dispatch.") if entry == "direct" else name
        assert ops[name]["fast_calls" if served else "fallback_calls"] == 1


@pytest.mark.parametrize("verify", [False, True], ids=["interception", "debugging_mode"])
@pytest.mark.parametrize("op", ["copy_out", "copy_out_column_outs", "chunk_cat"])
def test_a_tensor_that_is_not_contiguous_stays_stock_as_not_contiguous(op, verify):
    # The FSDP copies' kernels read row-major spans: a transposed (dense) input, or outs that are
    # column slices of one buffer (apart, not contiguous), go to stock's op, counted under the
    # reason that names it (not aliasing: spans say nothing of a tensor that is not contiguous).
    def fresh():
        if op == "copy_out_column_outs":
            buf = torch.full((4, 8), 7.0)
            return [buf[:, :3], buf[:, 3:]]
        return [torch.full(s, 7.0) for s in ([(4, 3), (4, 5)] if op == "copy_out" else [(2, 5)])]

    def call(outs):
        if op == "copy_out":
            src = torch.arange(32.0).view(8, 4).t()  # (4, 8), dense, not contiguous
            fsdp.split_with_sizes_copy(src, [3, 5], dim=1, out=outs)
        elif op == "copy_out_column_outs":
            fsdp.split_with_sizes_copy(torch.arange(32.0).view(4, 8), [3, 5], dim=1, out=outs)
        else:
            fsdp.chunk_cat([torch.arange(6.0).view(3, 2).t(), torch.ones(4)], 0, 2, out=outs[0])

    want = fresh()
    call(want)
    got = fresh()
    with nd.NpuFastCopyMode(verify=verify) as mode:
        call(got)
    assert _same(got, want) and [t._version for t in got] == [t._version for t in want]
    assert mode.stats.as_dict()["fallback_reasons"] == {"not_contiguous": 2}
