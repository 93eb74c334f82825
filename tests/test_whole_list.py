"""Devices whose batched kernel is exact only on the whole lists stock gives it (CUDA: see
capabilities.py ``whole_list_only``). The call goes to stock's op whole: one foreach group where
stock batches the list, else a whole-stock plan with reason ``whole_list_op``.

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
from cases import assert_same, bits, cases, direct_copy, one_pass_calls, mode_copy, op_copy, run, stock_copy

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


def test_a_list_stock_batches_is_one_group_of_every_pair():
    with whole_list_cpu():
        dst, src = batched_list()
        p = nd.explain(dst, src)
    assert p.stock_reason is None and not p.runs and not p.fallback and not p.empty
    assert [g.indices for g in p.groups] == [list(range(240))]  # empties too, as stock's op gets them
    assert p.groups[0].launches == 3


@pytest.mark.parametrize("name", sorted(pair_by_pair_lists()))
def test_a_list_stock_copies_pair_by_pair_goes_to_stock_whole(name):
    with whole_list_cpu():
        dst, src = pair_by_pair_lists()[name]
        p = nd.explain(dst, src)
    assert p.stock_reason is not None and p.stock_reason[0] == "whole_list_op"
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
    assert s["paths"]["foreach"] == {"calls": 1, "pairs": 240, "tensors": 240, "bytes": 60 * (5 + 17 + 64) * 2, "launches": 3}
    assert s["paths"]["stock"]["tensors"] == 2 and s["fallback_reasons"] == {"whole_list_op": 2}


def test_strict_refuses_a_list_stock_copies_pair_by_pair_before_writing():
    dst, src = pair_by_pair_lists()["two_source_dtypes"]
    with whole_list_cpu(), pytest.raises(FastCopyFallbackError, match="whole lists"):
        with nd.NpuFastCopyMode(strict=True):
            torch._foreach_copy_(dst, src)
    assert all(not d.any() for d in dst)


@pytest.mark.skipif(not _native.available(), reason="native library not built")
def test_the_one_pass_plan_leaves_such_a_device_to_the_planner():
    before = one_pass_calls()
    with whole_list_cpu():
        nd.foreach_copy_([torch.zeros(3)], [torch.ones(3)])
    assert one_pass_calls() == before


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
        assert nd.explain([torch.zeros(8)[0:4], torch.zeros(8)[2:6]], [torch.ones(4)] * 2).groups
        got = outcome(entry)
    assert torch.equal(want[0], got[0]) and want[1] == got[1]


@pytest.mark.skipif(not _native.available(), reason="native library not built")
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
def test_the_group_is_handed_to_stocks_op_not_to_this_librarys_kernel(entry):
    before = _native.info()["kernel_passes"]
    with whole_list_cpu():
        entry(*batched_list())
    assert _native.info()["kernel_passes"] == before


# ---- CUDA's kernel, simulated on the CPU -----------------------------------------------------
# A subprocess registers a CPU kernel for aten::_foreach_copy_ that does what ATen's CUDA kernel
# does: for a list it batches (one device, dtype per list, equal sizes and strides but on size-1
# dims, all dense) it copies and then bumps every destination itself, even below ADInplaceOrView,
# raising at an inference destination; any other list is a copy_ loop. Each case runs through stock
# and every entry, from fresh tensors, and compares errors, bits and versions.
_SIMULATED = r"""
import dataclasses, sys, torch
sys.path.insert(0, sys.argv[1])
import npu_dispatch as nd
from npu_dispatch import capabilities
from torch._prims_common import is_non_overlapping_and_dense_or_false as _dense
INFERENCE_WRITE_ERROR = ("Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone "
                         "to get a normal tensor before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 "
                         "for more details.")
from cases import bits, direct_copy, mode_copy, op_copy, stock_copy

def batches(self, src):
    dev = self[0].device
    for lst in (self, src):
        if any(t.device != dev or not _dense(t) or t.dtype != lst[0].dtype for t in lst):
            return False
    return all(d.shape == s.shape and all(n == 1 or a == b for n, a, b in zip(d.shape, d.stride(), s.stride()))
               for d, s in zip(self, src))

def kernel(self, src, non_blocking=False):
    if batches(self, src):
        with torch._C._AutoDispatchBelowADInplaceOrView():
            for d, s in zip(self, src):
                if d.numel():
                    d.copy_(s)
        for d in self:
            if d.is_inference():
                if not torch.is_inference_mode_enabled():
                    raise RuntimeError(INFERENCE_WRITE_ERROR)
            else:
                torch.autograd.graph.increment_version(d)
    else:
        for d, s in zip(self, src):
            d.copy_(s, non_blocking=non_blocking)

lib = torch.library.Library("aten", "IMPL")
lib.impl("_foreach_copy_", kernel, "CPU")

def inference(n):
    with torch.inference_mode():
        return torch.zeros(n)

z, o = torch.zeros, torch.ones
CASES = {
    "batched": lambda: ([z(3), z(0), z(4)], [o(3), o(0), o(4)]),
    "batched_views": lambda: (list(z(10, dtype=torch.bfloat16).split([3, 0, 7])), [o(3), o(0), o(7)]),
    "size1_strides": lambda: ([torch.empty_strided((3, 1), (1, 5)).zero_(), z(2)], [o(3, 1), o(2)]),
    "pair_by_pair": lambda: ([z(3), z(4, dtype=torch.bfloat16)], [o(3), o(4)]),
    "shape_error": lambda: ([z(4), z(3)], [o(4), o(5)]),
    "inference_in_batched": lambda: ([z(0), inference(3), z(2)], [o(0), o(3), o(2)]),
    "empty_inference_in_batched": lambda: ([z(3), inference(0)], [o(3), o(0)]),
    "inference_pair_by_pair": lambda: ([z(2), inference(3), z(2, dtype=torch.bfloat16)], [o(2), o(3), o(2)]),
    "same_destination_twice": lambda: (lambda a: ([a, a], [o(3), torch.full((3,), 2.0)]))(z(3)),
}

def verify_mode(d, s):
    with nd.NpuFastCopyMode(verify=True):
        torch._foreach_copy_(d, s)

def below(fn):
    def go(d, s):
        with torch._C._AutoDispatchBelowADInplaceOrView():
            fn(d, s)
    return go

def outcome(fn, make):
    d, s = make()
    try:
        fn(d, s)
        err = None
    except Exception as e:
        err = (type(e).__name__, str(e))
    return err, [bits(t).tolist() for t in d], [None if t.is_inference() else t._version for t in d]

cap = dataclasses.replace(capabilities.lookup("cpu"), name="cuda-like", max_tensors_per_launch=110,
                          whole_list_only=True)
bad = []
for name, make in CASES.items():
    for wrap in ("plain", "below"):
        want = outcome(stock_copy if wrap == "plain" else below(stock_copy), make)
        for entry in (direct_copy, op_copy, mode_copy, verify_mode):
            if wrap == "below" and entry is verify_mode:
                continue  # the debugging mode's handler cannot tell (a Python dispatch mode's limit)
            with capabilities.override({"cpu": cap}):
                got = outcome(entry if wrap == "plain" else below(entry), make)
            if got != want:
                bad.append((name, wrap, entry.__name__, want, got))
# fsdp.all_gather_copy_in: the output's bits and version, and whether the input is a view of it.
def gather_stock(*a):
    return torch.ops.fsdp.all_gather_copy_in(*a)

def gather_mode(*a):
    with nd.NpuFastCopyMode():
        return torch.ops.fsdp.all_gather_copy_in(*a)

def gather_op(*a):
    return torch.ops.npu_dispatch.all_gather_copy_in(*a)

def gather(fn, sizes, wrap):
    ins = [torch.full((n,), float(k + 1)) for k, n in enumerate(sizes)]
    out = torch.zeros(2 * sum(sizes))
    if wrap == "below":
        with torch._C._AutoDispatchBelowADInplaceOrView():
            inp, o = fn(ins, out, sizes, sum(sizes), 1)
    else:
        inp, o = fn(ins, out, sizes, sum(sizes), 1)
    return bits(out).tolist(), out._version, inp._base is out, o is out

for sizes in ([3, 5], [3, 0, 5]):
    for wrap in ("plain", "below"):
        want = gather(gather_stock, sizes, wrap)
        for fn in (nd.all_gather_copy_in, gather_op, gather_mode):
            with capabilities.override({"cpu": cap}):
                got = gather(fn, sizes, wrap)
            if got != want:
                bad.append(("all_gather_copy_in", sizes, wrap, getattr(fn, "__name__", "?"), want, got))
for b in bad:
    print(b)
print("differences:", len(bad))
"""


def test_a_simulated_cuda_kernel_gives_stocks_errors_bits_and_versions_through_every_entry():
    # _foreach_copy_ through the direct op, the op, the mode and verify; all_gather_copy_in through
    # the direct op, the op and the mode; plain and below ADInplaceOrView.
    import os
    import subprocess
    import sys

    here = os.path.dirname(__file__)
    out = subprocess.run([sys.executable, "-c", _SIMULATED, here], capture_output=True, text=True,
                         env={**os.environ, "NPU_DISPATCH_NATIVE": os.environ.get("NPU_DISPATCH_NATIVE", "1")})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("differences: 0"), out.stdout[-3000:]


@pytest.mark.skipif(not _native.available(), reason="native library not built")
def test_below_ad_inplace_or_view_a_whole_list_device_needs_no_bump_of_ours():
    # Stock's copy_ loop bumps nothing there. A device with no entry keeps the bumps: whether its
    # batched kernel bumps by itself is unknown. An npu entry says its batched kernel bumps nothing
    # (op-plugin: batched_keeps_versions), and this list takes that kernel. A whole_list_only
    # device's kernel is watched by the executors. Meta tensors stand in for the device, through the C++
    # entry that takes stock's rule where the call is made (bump=None).
    planned = _native.planned_op()

    def moved(entries, device="meta"):
        d = [torch.zeros(3, device=device)]
        with capabilities.override(entries), torch._C._AutoDispatchBelowADInplaceOrView():
            planned(d, [torch.ones(3, device=device)], False, False, None)
        return d[0]._version

    whole = dataclasses.replace(capabilities.lookup("cpu"), name="cuda-like", whole_list_only=True)
    assert moved({}) == 1
    assert moved({"meta": whole}) == 0
    assert moved({"meta": capabilities.npu_capability("9.1.0")}) == 0
    assert moved({}, device="cpu") == 0
