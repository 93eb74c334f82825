"""CUDA: the fast path sends eligible pairs to ATen's fused ``_foreach_copy_`` (multi_tensor_apply)
and must stay bitwise stock's, through every entry. Skipped (with the reason) where no CUDA device
is visible, as on CI; run on a GPU machine with ``python -m pytest tests/test_cuda.py``.

Cases are built on the CPU by cases.py and mirrored onto the device storage by storage, so
layouts, adjacency and aliasing are exactly the CPU case's.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

import npu_dispatch as nd
from cases import Case, Pair, assert_same, bits, build, cases, direct_copy, mode_copy, op_copy, stock_copy

if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible", allow_module_level=True)

DEV = torch.device("cuda")
ENTRIES = [direct_copy, op_copy, mode_copy]


def to_device(case: Case):
    """(dsts, srcs, storages) of ``case`` on the GPU, one device storage per CPU storage."""
    dsts, srcs, _ = build(case)
    moved = {}

    def move(t):
        key = t.untyped_storage().data_ptr()
        if key not in moved:
            moved[key] = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).to(DEV).untyped_storage()
        return torch.empty(0, dtype=t.dtype, device=DEV).set_(moved[key], t.storage_offset(), t.shape, t.stride())

    d, s = [move(t) for t in dsts], [move(t) for t in srcs]
    storages = list({id(t.untyped_storage()): t for t in d + s}.values())
    return d, s, storages


def run_on_device(case: Case, fn) -> dict:
    dsts, srcs, storages = to_device(case)
    try:
        fn(dsts, srcs)
        error = None
    except Exception as e:  # compared against stock's, type and message
        error = (type(e), str(e))
    torch.cuda.synchronize()
    return {
        "error": error,
        "storages": [torch.empty(0, dtype=torch.uint8, device=DEV).set_(t.untyped_storage()).cpu() for t in storages],
        "dst_versions": [t._version for t in dsts],
        "src_versions": [t._version for t in srcs],
        "out": None,
    }


@settings(max_examples=80, deadline=None)
@given(cases(max_len=200))
def test_every_entry_matches_stock_bitwise_on_cuda(case):
    stock = run_on_device(case, stock_copy)
    for entry in ENTRIES:
        assert_same(stock, run_on_device(case, entry))


def test_mixed_precision_cast_takes_the_fused_kernel():
    # 300 fp32 shards cast into bf16 (FSDP2's mixed-precision copy): one foreach group, launched
    # in chunks of 110 tensors as multi_tensor_apply does (capabilities.py).
    c = Case(tuple(Pair((n,), torch.float32, torch.bfloat16, "contiguous", "contiguous")
                   for n in [1 + (k * 37) % 500 for k in range(300)]), False, False, (), 3)
    stock = run_on_device(c, stock_copy)
    mode = nd.NpuFastCopyMode()
    with mode:
        ours = run_on_device(c, lambda d, s: torch._foreach_copy_(d, s))
    assert_same(stock, ours)
    paths = mode.stats.as_dict()["paths"]
    assert paths["foreach"]["tensors"] == 300 and paths["foreach"]["launches"] == 3
    assert mode.stats.as_dict()["fallback_reasons"] == {}


@pytest.mark.parametrize("rank", [0, 3])
def test_all_gather_copy_in_matches_stock_on_cuda(rank):
    sizes = [7, 1, 30, 0, 12]
    numel = sum(sizes)

    def go(fn):
        g = torch.Generator().manual_seed(0)
        ins = [torch.randn(n, generator=g).to(DEV) for n in sizes]
        out = torch.full((numel * 4,), float("nan"), dtype=torch.bfloat16, device=DEV)
        inp, o = fn(ins, out, sizes, numel, rank)
        return out, inp, o

    out0, _, _ = go(torch.ops.fsdp.all_gather_copy_in)
    out1, inp1, o1 = go(nd.all_gather_copy_in)
    with nd.NpuFastCopyMode():
        out2, _, _ = go(torch.ops.fsdp.all_gather_copy_in)
    assert torch.equal(bits(out0.cpu()), bits(out1.cpu())) and torch.equal(bits(out0.cpu()), bits(out2.cpu()))
    assert o1 is out1 and inp1.data_ptr() == out1.data_ptr() + numel * rank * 2
    assert out1._version == out0._version


def test_cpu_and_cuda_mixed_in_one_list_match_stock():
    # Stock copies a list spanning two devices pair by pair; so does the library (whole_list_op).
    def make():
        g = torch.Generator().manual_seed(1)
        srcs = [torch.randn(5, generator=g), torch.randn(6, generator=g).to(DEV), torch.randn(7, generator=g).to(DEV)]
        dsts = [torch.zeros(5, device=DEV), torch.zeros(6), torch.zeros(7, dtype=torch.bfloat16, device=DEV)]
        return dsts, srcs

    results = []
    for fn in (stock_copy, *ENTRIES):
        d, s = make()
        fn(d, s)
        torch.cuda.synchronize()
        results.append(([bits(t.cpu()) for t in d], [t._version for t in d]))
    for got in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0][0], got[0])) and got[1] == results[0][1]


def test_compiled_copy_under_the_mode_matches_eager_stock():
    def f(dsts, srcs):
        torch._foreach_copy_(dsts, srcs)
        return dsts

    def make():
        g = torch.Generator().manual_seed(2)
        return ([torch.zeros(n, dtype=torch.bfloat16, device=DEV) for n in (3, 64, 1000)],
                [torch.randn(n, generator=g).to(DEV) for n in (3, 64, 1000)])

    d0, s0 = make()
    f(d0, s0)
    d1, s1 = make()
    torch._dynamo.reset()
    with nd.NpuFastCopyMode():
        torch.compile(f, fullgraph=True)(d1, s1)
    torch.cuda.synchronize()
    assert all(torch.equal(bits(a.cpu()), bits(b.cpu())) for a, b in zip(d0, d1))
