"""The npu path on the emulated Ascend device (npu_dispatch.testing.emulated_npu): results, errors
and version counters against stock on npu tensors, and device launches per CANN version against
op-plugin's rules (stock is the emulated op-plugin kernel itself)."""
from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_dispatch as nd
from npu_dispatch.testing import emulated_npu

CANNS = ("8.0.RC3", "8.1.RC1", "9.1.0")
f32, bf16, f16, i32, i64 = torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64


# On a machine with an Ascend NPU, NPU_DISPATCH_REAL_NPU=1 runs the semantics tests on torch_npu's
# device; the launch counts are the emulated device's, so those skip there.
REAL = os.environ.get("NPU_DISPATCH_REAL_NPU") == "1"


@pytest.fixture(scope="module", autouse=True)
def npu():
    if REAL:
        import torch_npu  # noqa: F401  only here: without CANN it breaks `import torch`

        yield
        return
    ok, why = emulated_npu.available()
    if not ok:
        if os.environ.get("NPU_DISPATCH_REQUIRE_NATIVE") == "1":
            pytest.fail(f"the emulated npu must build in CI: {why}")
        pytest.skip(f"no emulated npu here: {why}")
    emulated_npu.install(emulated_npu.DEFAULT_CANN)
    yield
    emulated_npu.install(emulated_npu.DEFAULT_CANN)


def cann(version: str):
    """Model op-plugin at this CANN version (the emulated device only)."""
    if REAL:
        pytest.skip("launch counts and CANN versions are the emulated device's")
    emulated_npu.install(version)


def launches() -> dict:
    return {} if REAL else emulated_npu.launches()


def reset_launches() -> None:
    if not REAL:
        emulated_npu.reset_launches()


# ---------------------------------------------------------------------------------------------
# Lists on the device


def _fill(t: torch.Tensor, gen: torch.Generator) -> None:
    """Random values with NaN payloads, infinities and signed zeros where the dtype has them."""
    if t.numel() == 0:
        return
    if t.dtype.is_floating_point:
        vals = torch.randn(t.shape, generator=gen).to(t.dtype)
        flat = vals.view(-1)
        special = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf")]).to(t.dtype)
        for k in range(0, flat.numel(), 7):
            flat[k] = special[(k // 7) % 4]
        if t.dtype == f32 and flat.numel() > 3:
            flat.view(torch.int32)[3] = 0x7FA00001  # a signalling NaN with a payload
    else:
        vals = torch.randint(-100, 100, t.shape, generator=gen).to(t.dtype)
    t.copy_(vals.to(t.device))


def make_list(specs, dst_adjacent: bool, src_adjacent: bool, seed: int):
    """``specs``: (numel, src dtype, dst dtype, transposed) per pair. Adjacent sides carve
    consecutive same-dtype tensors from one npu buffer."""
    gen = torch.Generator().manual_seed(seed)

    def side(dtypes, adjacent):
        out = []
        if adjacent and len(set(dtypes)) == 1:
            buf = torch.empty(sum(n for n, *_ in specs), dtype=dtypes[0], device="npu")
            out = list(torch.split(buf, [n for n, *_ in specs]))
        else:
            out = [torch.empty(n, dtype=dt, device="npu") for (n, *_), dt in zip(specs, dtypes)]
        return out

    dsts = side([d for _, _, d, _ in specs], dst_adjacent)
    srcs = side([s for _, s, _, _ in specs], src_adjacent)
    for k, (n, _, _, transposed) in enumerate(specs):
        if transposed and n % 2 == 0 and n > 0:
            srcs[k] = srcs[k].view(2, n // 2).t()
            dsts[k] = dsts[k].view(n // 2, 2)
    for t in (*dsts, *srcs):
        _fill(t, gen)
    return dsts, srcs


def clone_lists(dsts, srcs):
    """The same lists again, with the same layout: each storage cloned once and its tensors
    rebuilt as views of one base on it, so tensors that shared a version counter still do."""
    bases = {}

    def dup(t):
        key = (t.untyped_storage()._cdata, t.dtype)  # the StorageImpl: empty ones share data_ptr 0
        if key not in bases:
            storage = _clone_storage(t.untyped_storage())
            bases[key] = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                storage, 0, (storage.nbytes() // t.element_size(),), (1,))
        return bases[key].as_strided(t.shape, t.stride(), t.storage_offset())

    return [dup(t) for t in dsts], [dup(t) for t in srcs]


def _clone_storage(storage):
    n = storage.nbytes()
    fresh = torch.empty(n, dtype=torch.uint8, device=storage.device)
    fresh.copy_(torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (n,), (1,)))
    return fresh.untyped_storage()


def bits(t: torch.Tensor) -> torch.Tensor:
    c = t.cpu().contiguous()
    return c.view(torch.uint8) if c.numel() else c


def run(fn, dsts, srcs):
    reset_launches()
    versions = [d._version for d in dsts]
    fn(dsts, srcs)
    counted = launches()  # before reading the results back: each .cpu() is a launch too
    return [bits(d) for d in dsts], [d._version - v for d, v in zip(dsts, versions)], counted


def stock(dsts, srcs):
    torch._foreach_copy_(dsts, srcs)


def under_mode(dsts, srcs):
    with nd.NpuFastCopyMode():
        torch._foreach_copy_(dsts, srcs)


def direct(dsts, srcs):
    nd.foreach_copy_(dsts, srcs)


def total(launches: dict) -> int:
    return sum(launches.values())


pair = st.tuples(st.sampled_from([0, 1, 2, 6, 40, 257]), st.sampled_from([f32, bf16, f16, i32, i64]),
                 st.sampled_from([f32, bf16, f16, i32, i64]), st.booleans())


@settings(max_examples=40, deadline=None)
@given(st.lists(pair, min_size=1, max_size=60), st.booleans(), st.booleans(), st.sampled_from(CANNS),
       st.booleans(), st.integers(0, 3))
def test_npu_lists_match_stock_bitwise_with_versions_and_never_more_launches_when_same_dtype(
        specs, dst_adj, src_adj, version, same_dtype, seed):
    if same_dtype:
        specs = [(n, s, s, tr) for n, s, _, tr in specs]
    if not REAL:
        cann(version)
    ref = make_list(specs, dst_adj, src_adj, seed)
    want, want_v, want_l = run(stock, *ref)
    for fn in (under_mode, direct):
        got, got_v, got_l = run(fn, *clone_lists(*ref))
        assert all(torch.equal(a, b) for a, b in zip(want, got)), fn.__name__
        assert got_v == want_v, fn.__name__
        if same_dtype:
            assert total(got_l) <= total(want_l), (fn.__name__, got_l, want_l)


@pytest.mark.parametrize("version", CANNS)
def test_npu_errors_match_stock_and_write_what_stock_writes(version):
    if not REAL:
        cann(version)
    bad_cases = [
        ([], []),
        ([torch.zeros(2, device="npu")], []),
        ([torch.zeros(2, device="npu"), torch.zeros(3, device="npu")], [torch.ones(2, device="npu")]),
        ([torch.zeros(2, device="npu"), torch.zeros(3, device="npu")],
         [torch.ones(2, device="npu"), torch.ones(4, device="npu")]),
    ]
    for dsts, srcs in bad_cases:
        errors = []
        written = []
        for fn in (stock, under_mode):
            d = [t.clone() for t in dsts]
            s = [t.clone() for t in srcs]
            with pytest.raises(Exception) as info:
                fn(d, s)
            errors.append((type(info.value), str(info.value).split("\n")[0]))
            written.append([bits(t) for t in d])
        assert errors[0] == errors[1]
        assert all(torch.equal(a, b) for a, b in zip(*written))


# ---------------------------------------------------------------------------------------------
# Lists the property test does not build: host <-> device, aliasing, raising, lazy bits


def outcome(fn, make, non_blocking=False, below=False):
    """Everything stock leaves observable: the error (type, first line), the destinations' bits
    and version moves; and the device launches (never more than stock's)."""
    dsts, srcs = make()
    version = lambda t: None if t.is_inference() else t._version  # noqa: E731
    versions = [version(d) for d in dsts]
    reset_launches()
    error = None
    try:
        if below:
            with torch._C._AutoDispatchBelowADInplaceOrView():
                fn(dsts, srcs, non_blocking)
        else:
            fn(dsts, srcs, non_blocking)
    except Exception as e:  # noqa: BLE001  compared with stock's
        error = (type(e), str(e).split("\n")[0])
    counted = launches()
    moved = [None if v is None else version(d) - v for d, v in zip(dsts, versions)]
    return error, [bits(d).tolist() for d in dsts], moved, counted


def stock_nb(dsts, srcs, non_blocking):
    torch._foreach_copy_(dsts, srcs, non_blocking=non_blocking)


def mode_nb(dsts, srcs, non_blocking):
    with nd.NpuFastCopyMode():
        torch._foreach_copy_(dsts, srcs, non_blocking=non_blocking)


def direct_nb(dsts, srcs, non_blocking):
    nd.foreach_copy_(dsts, srcs, non_blocking)


def _z(n, dt=f32, dev="npu"):
    return torch.zeros(n, dtype=dt, device=dev)


def _aliasing_across_groups():
    z = torch.full((4,), 3.0, dtype=bf16, device="npu")
    return ([_z(4), z, _z(4, bf16)],
            [torch.full((4,), 1.0, dtype=bf16, device="npu"), torch.full((4,), 7.0, device="npu"), z])


def _chain():
    base = [torch.full((4,), float(i), device="npu") for i in range(50)]
    return base[:-1], base[1:]


def _inference_dsts():
    with torch.inference_mode():
        d = [_z(4) for _ in range(3)]
    return d, [torch.ones(4, device="npu") for _ in range(3)]


SPECIAL_LISTS = {
    "device_to_host": lambda: ([torch.zeros(4) for _ in range(3)], [torch.arange(4.0, device="npu") for _ in range(3)]),
    "host_to_npu1": lambda: ([_z(4, dev="npu:1") for _ in range(3)], [torch.arange(4.0) for _ in range(3)]),
    "host_to_device_two_dtypes": lambda: ([_z(4, bf16) for _ in range(2)], [torch.arange(4.0) for _ in range(2)]),
    "host_to_device_transposed": lambda: ([_z(4).view(2, 2) for _ in range(2)],
                                          [torch.arange(4.0).view(2, 2).t() for _ in range(2)]),
    "transfer_beside_a_fast_pair": lambda: ([_z(4).view(2, 2) for _ in range(10)] + [_z(3, bf16)],
                                            [torch.arange(4.0).view(2, 2).t() for _ in range(10)]
                                            + [torch.ones(3, dtype=bf16, device="npu")]),
    "aliasing_across_groups": _aliasing_across_groups,
    "aliasing_chain": _chain,
    "raising_in_the_second_group": lambda: ([_z(2), _z(2), _z(3)],
                                            [torch.ones(2, device="npu"), torch.ones(2, dtype=bf16, device="npu"),
                                             torch.ones(4, device="npu")]),
    "raising_in_two_groups": lambda: ([_z(2), _z(3), _z(5)],
                                      [torch.ones(2, device="npu"), torch.ones(4, dtype=bf16, device="npu"),
                                       torch.ones(6, device="npu")]),
    "inference_destinations": _inference_dsts,
    "conjugate_source": lambda: ([_z(2, torch.complex64)], [torch.tensor([1 + 2j, 3 - 4j]).to("npu").conj()]),
    "negative_source": lambda: ([_z(2)], [torch._neg_view(torch.tensor([1.0, -0.0]).to("npu"))]),
    "one_cast_pair": lambda: ([_z(4, bf16)], [torch.arange(4.0, device="npu")]),
    "mixed_destinations": lambda: ([_z(4, bf16 if k % 2 else f32) for k in range(20)],
                                   [torch.arange(4.0, device="npu") for _ in range(20)]),
}


@pytest.mark.parametrize("below", [False, True], ids=["", "below_ad_inplace_or_view"])
@pytest.mark.parametrize("non_blocking", [False, True], ids=["blocking", "non_blocking"])
@pytest.mark.parametrize("name", sorted(SPECIAL_LISTS))
def test_npu_lists_of_every_kernel_match_stock_in_bits_errors_versions_and_launches(name, non_blocking, below):
    if not REAL:
        cann("8.0.RC3")
    make = SPECIAL_LISTS[name]
    want = outcome(stock_nb, make, non_blocking, below)
    for fn in (mode_nb, direct_nb):
        got = outcome(fn, make, non_blocking, below)
        assert got[:3] == want[:3], fn.__name__
        assert total(got[3]) <= total(want[3]), (fn.__name__, got[3], want[3])


def test_lazy_bits_and_views_round_trip_on_the_device():
    if not REAL:
        cann("8.0.RC3")
    x = torch.tensor([1 + 2j, 3 - 4j])
    assert torch.equal(x.to("npu").conj().cpu(), x.conj())
    assert torch.equal(torch._neg_view(x.to("npu")).cpu(), -x)
    z = torch.arange(6.0, device="npu")
    z.unfold(0, 2, 2).fill_(9)  # a view: writes reach z
    assert z.cpu().tolist() == [9.0] * 6
    t = torch.zeros(4, device="npu:1")
    t.untyped_storage().resize_(0)
    t.untyped_storage().resize_(16)
    assert t.untyped_storage().device == torch.device("npu", 1)


# ---------------------------------------------------------------------------------------------
# Launch counts per CANN version (N = 100 pairs of 64..163 elements)

N = 100


def _lists(kind: str):
    sizes = [64 + k for k in range(N)]
    gen = torch.Generator().manual_seed(0)
    if kind == "adjacent":  # both sides one buffer each, one dtype
        src = torch.randn(sum(sizes), generator=gen).to("npu")
        dst = torch.empty(sum(sizes), device="npu")
        return list(torch.split(dst, sizes)), list(torch.split(src, sizes))
    srcs = [torch.randn(n, generator=gen).to("npu") for n in sizes]
    if kind == "same_dtype":
        return [torch.empty(n, device="npu") for n in sizes], srcs
    if kind == "cast_adjacent":  # FSDP2's mixed-precision cast: fp32 shards into one bf16 buffer
        return list(torch.split(torch.empty(sum(sizes), dtype=bf16, device="npu"), sizes)), srcs
    if kind == "cast":
        return [torch.empty(n, dtype=bf16, device="npu") for n in sizes], srcs
    if kind == "mixed_destinations":  # one source dtype, every other destination bf16
        return [torch.empty(n, dtype=bf16 if k % 2 else f32, device="npu") for k, n in enumerate(sizes)], srcs
    raise ValueError(kind)


def _ceil(n: int) -> int:
    return math.ceil(n / 48)


# (stock, mode) launches, by op-plugin's rules: below CANN 9.1 no cross-dtype pair has the batched
# kernel; a list of one source dtype with mixed destinations leaves it on every version.
EXPECTED = {
    "same_dtype": {v: ({"aclnnForeachCopy": _ceil(N)}, {"aclnnForeachCopy": _ceil(N)}) for v in CANNS},
    "adjacent": {v: ({"aclnnForeachCopy": _ceil(N)}, {"copy": 1}) for v in CANNS},
    "cast_adjacent": {
        "8.0.RC3": ({"copy": N}, {"aclnnForeachCopy": _ceil(N), "copy": 1}),
        "8.1.RC1": ({"copy": N}, {"aclnnForeachCopy": _ceil(N), "copy": 1}),
        "9.1.0": ({"aclnnForeachCopy": _ceil(N)}, {"aclnnForeachCopy": _ceil(N)}),
    },
    "cast": {
        "8.0.RC3": ({"copy": N}, {"aclnnForeachCopy": 2 * _ceil(N), "copy": 1}),
        "8.1.RC1": ({"copy": N}, {"aclnnForeachCopy": 2 * _ceil(N), "copy": 1}),
        "9.1.0": ({"aclnnForeachCopy": _ceil(N)}, {"aclnnForeachCopy": _ceil(N)}),
    },
    "mixed_destinations": {
        "8.0.RC3": ({"copy": N}, {"aclnnForeachCopy": 3 * _ceil(N // 2), "copy": 1}),
        "8.1.RC1": ({"copy": N}, {"aclnnForeachCopy": 3 * _ceil(N // 2), "copy": 1}),
        "9.1.0": ({"copy": N}, {"aclnnForeachCopy": 2 * _ceil(N // 2)}),
    },
}


@pytest.mark.parametrize("version", CANNS)
@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_launches_per_cann_version_match_op_plugin_rules_and_results_match_stock(kind, version):
    cann(version)
    want_stock, want_mode = EXPECTED[kind][version]
    ref = _lists(kind)
    got_stock = run(stock, *ref)
    got_mode = run(under_mode, *clone_lists(*ref))
    assert got_stock[2] == want_stock
    assert got_mode[2] == want_mode
    assert all(torch.equal(a, b) for a, b in zip(got_stock[0], got_mode[0]))
    assert got_mode[1] == got_stock[1]


def test_int64_lists_follow_the_cann_8_1_dtype_list():
    sizes = [5] * 60
    for version, batched in (("8.0.RC3", False), ("8.1.RC1", True)):
        cann(version)
        srcs = [torch.arange(n, dtype=i64, device="npu") for n in sizes]
        for fn in (stock, under_mode):
            dsts = [torch.empty(n, dtype=i64, device="npu") for n in sizes]
            launches = run(fn, dsts, srcs)[2]
            assert launches == ({"aclnnForeachCopy": 2} if batched else {"copy": 60}), (version, fn.__name__)


def test_uniform_host_to_device_lists_keep_op_plugins_batched_memcpy():
    cann("8.0.RC3")
    srcs = [torch.randn(8) for _ in range(10)]
    for fn in (stock, under_mode):
        dsts = [torch.empty(8, device="npu") for _ in range(10)]
        got = run(fn, dsts, srcs)
        assert got[2] == {"memcpyBatch": 1}, fn.__name__
        assert all(torch.equal(a, bits(s)) for a, s in zip(got[0], srcs))


def test_staged_cast_is_chunked_to_the_capabilitys_scratch_budget():
    import dataclasses

    cann("8.0.RC3")
    dsts, srcs = _lists("cast_adjacent")
    cap = nd.capabilities.lookup("npu")
    budget = 4 * 1024  # fp32 scratch bytes per chunk: about 10 pairs of ~100 elements
    with nd.capabilities.override({"npu": dataclasses.replace(cap, stage_bytes=budget)}):
        plan = nd.explain(dsts, srcs)
        assert len(plan.stages) > 1
        assert all(sum(srcs[i].numel() * 4 for i in s.indices) <= budget for s in plan.stages)
        assert plan.launches == sum(_ceil(len(s.indices)) + 1 for s in plan.stages) < N
        assert "staged group" in str(plan)
        got = run(under_mode, *clone_lists(dsts, srcs))
    want = run(stock, dsts, srcs)
    assert all(torch.equal(a, b) for a, b in zip(want[0], got[0]))
    with nd.capabilities.override({"npu": dataclasses.replace(cap, stage_bytes=0)}):
        assert not nd.explain(dsts, srcs).stages
    # A shard over the budget is copied by itself: its own chunk would cost more launches.
    big = [torch.randn(2000, device="npu")] + srcs[:20]
    dst_big = list(torch.split(torch.empty(sum(t.numel() for t in big), dtype=bf16, device="npu"),
                               [t.numel() for t in big]))
    with nd.capabilities.override({"npu": dataclasses.replace(cap, stage_bytes=budget)}):
        plan = nd.explain(dst_big, big)
        assert plan.fallback == [0] and all(0 not in st.indices for st in plan.stages)
        assert all(sum(big[i].numel() * 4 for i in st.indices) <= budget for st in plan.stages)


def test_stats_and_explain_name_the_staged_path():
    cann("8.0.RC3")
    dsts, srcs = _lists("cast_adjacent")
    with nd.NpuFastCopyMode() as mode:
        torch._foreach_copy_(dsts, srcs)
    paths = mode.stats.as_dict()["paths"]
    assert paths["staged"]["pairs"] == N and paths["staged"]["launches"] == _ceil(N) + 1
    assert mode.stats.total_fallback_calls == 0
    text = str(nd.explain(dsts, srcs))
    assert f"{_ceil(N) + 1} device launch(es)" in text and "1 flat cast into the adjacent destinations" in text


def test_install_refuses_with_a_clear_error_when_torch_npu_is_loaded(monkeypatch):
    cann("8.0.RC3")
    import sys
    import types

    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    with pytest.raises(RuntimeError, match="the real torch_npu is loaded"):
        emulated_npu.install()


def test_the_capability_table_reads_the_emulated_cann_version():
    cann("8.0.RC3")
    for version in CANNS:
        cann(version)
        assert nd.capabilities.cann_version() == version == emulated_npu.cann_version()
        assert nd.capabilities.lookup("npu") == nd.capabilities.npu_capability(version)


# ---------------------------------------------------------------------------------------------
# FSDP2's copy-out and reduce-scatter copy-in on the device

@pytest.mark.parametrize("version", CANNS)
def test_copy_out_on_npu_takes_fewer_launches_and_chunk_cat_stays_the_device_op(version):
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  registers fsdp::

    cann(version)
    world, sizes = 8, [300, 17, 1024, 5, 64, 200, 33, 90, 128]
    gen = torch.Generator().manual_seed(0)
    src = torch.randn(world * sum(sizes), generator=gen).to(bf16).to("npu").view(world, -1)
    grads = [torch.randn(n, 3, generator=gen).to(bf16).to("npu") for n in sizes]
    width = sum(-(-n // world) * 3 for n in sizes)
    results = {}
    for name, ctx in (("stock", None), ("mode", nd.NpuFastCopyMode)):
        out = [torch.zeros(world, n, dtype=bf16, device="npu") for n in sizes]
        rs = torch.full((world, width), 7.0, device="npu")
        with (ctx() if ctx else torch.no_grad()):
            reset_launches()
            torch.ops.fsdp.split_with_sizes_copy(src, sizes, dim=1, out=out)
            copy_out = launches()
            reset_launches()
            torch.ops.fsdp.chunk_cat(grads, 0, world, out=rs)
            chunk_cat = launches()
        results[name] = (copy_out, chunk_cat, [bits(o) for o in out], bits(rs),
                         [o._version for o in out], rs._version)
    stock, mode = results["stock"], results["mode"]
    assert all(torch.equal(a, b) for a, b in zip(stock[2], mode[2])) and torch.equal(stock[3], mode[3])
    assert stock[4:] == mode[4:]
    assert stock[0] == {"copy": len(sizes)}  # one strided copy per parameter
    assert mode[0] == {"aclnnForeachCopy": math.ceil(world * len(sizes) / 48)}  # the rows, batched
    assert mode[1] == stock[1]  # chunk_cat stays the device's own op: one call


def test_chunk_cat_on_npu_refuses_casts_stock_refuses():
    cann("8.0.RC3")
    tensors = [torch.tensor([1.5, -2.5, 3.0], device="npu")]
    results = []
    for ctx in (None, nd.NpuFastCopyMode):
        out = torch.zeros(1, 3, dtype=torch.int32, device="npu")
        with (ctx() if ctx else torch.no_grad()):
            with pytest.raises(Exception) as info:
                torch.ops.fsdp.chunk_cat(tensors, 0, 1, out=out)
        results.append((type(info.value), str(info.value).split("\n")[0], bits(out), out._version))
    assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(*results))


def test_explain_names_a_lazy_conjugate_source_as_a_pair_off_the_fast_path():
    # Every pair off the fast path on a batching device: its own op takes the call whole. The
    # reason is the source's lazy bit, not a destination's (which stock's dispatcher refuses).
    dsts = [torch.zeros(4, device="npu")]
    srcs = [torch.arange(4.0, device="npu")._neg_view()]
    plan = nd.explain(dsts, srcs)
    assert plan.stock_reason[0] == "conj_neg", plan.stock_reason
    assert plan.stock_reason[1] == ("no pair has a fast path (pair 0 has a lazy conjugate or negative bit, the "
                                    "first): the device's own _foreach_copy_ takes the whole call"), plan.stock_reason
    assert plan.launches == 1
    ref = [torch.zeros(4, device="npu")]
    torch._foreach_copy_(ref, srcs)
    with nd.NpuFastCopyMode() as mode:
        torch._foreach_copy_(dsts, srcs)
    assert torch.equal(dsts[0].cpu().view(torch.int32), ref[0].cpu().view(torch.int32))
    # The dispatcher's Negative key resolves the source's lazy bit before BackendSelect: the
    # interception sees a plain source and serves it.
    assert mode.stats.fast_path_calls == 1, mode.stats.report()


def test_a_list_with_no_fast_pair_counts_each_pair_under_its_own_reason():
    # The device's own op takes the whole call, in stock's launches; the stats name each pair's
    # reason, not the first pair's for all, and an empty pair under that own op.
    cann("8.0.RC3")  # no int64 in the batched kernel

    def lists():
        return ([torch.zeros(3, 4, device="npu"), torch.zeros(5, dtype=i64, device="npu"), torch.zeros(0, device="npu")],
                [torch.arange(12.0, device="npu").view(4, 3).t(), torch.arange(5, device="npu"),
                 torch.zeros(0, device="npu")])

    want = run(stock, *lists())
    assert nd.explain(*lists()).stock_reason[0] == "strides"
    with nd.NpuFastCopyMode() as mode:
        got = run(stock, *lists())
    assert all(torch.equal(a, b) for a, b in zip(got[0], want[0])) and got[1:] == want[1:]
    assert mode.stats.fallback_reasons == {"strides": 1, "dtype": 1, "device_op": 1}, mode.stats.report()
