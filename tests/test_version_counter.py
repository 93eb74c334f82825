"""A destination without a version counter: an inference tensor given another tensor's `.data`.

Its key set looks plain and ``is_inference()`` is False, yet stock's version bump raises at that
pair outside inference mode (after writing it, and before any later pair). Checked against stock
through every entry; CI runs the native library, `NPU_DISPATCH_NATIVE=0` runs every copy as stock.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from cases import direct_copy, mode_copy, op_copy, storage_bytes

ENTRIES = [direct_copy, op_copy, mode_copy]


def _no_version_counter(n: int) -> torch.Tensor:
    with torch.inference_mode():
        t = torch.zeros(n)
    t.data = torch.zeros(n)  # plain CPU keys, is_inference() False, and still no version counter
    return t


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("context", [contextlib.nullcontext, torch.no_grad, torch.inference_mode],
                         ids=["grad", "no_grad", "inference_mode"])
@pytest.mark.parametrize("pos", [0, 3])
@pytest.mark.parametrize("numel", [10, 300_000])
def test_destination_without_version_counter_as_stock(entry, context, pos, numel):
    # Stock's bump raises at that pair outside inference mode, after writing it and none after it;
    # inside, it copies everything. The one-pass plan refuses such a destination (its keys look plain).
    def call(fn):
        torch.manual_seed(pos)
        d = [torch.zeros(numel) for _ in range(4)]
        d[pos] = _no_version_counter(numel)
        s = [torch.randn(numel) for _ in range(4)]
        err = None
        with context():
            try:
                fn(d, s)
            except RuntimeError as e:
                err = str(e)
        return err, [None if i == pos else t._version for i, t in enumerate(d)], [storage_bytes(t) for t in d]

    want, got = call(torch._foreach_copy_), call(entry)
    assert got[0] == want[0] and got[1] == want[1]
    assert all(torch.equal(a, b) for a, b in zip(got[2], want[2]))
    assert (want[0] is None) == (context is torch.inference_mode)


def _inference_data(n: int) -> torch.Tensor:
    t = torch.zeros(n)
    with torch.inference_mode():
        t.data = torch.zeros(n)  # is_inference() True, and still its own version counter
    return t


def _inference_source(n: int) -> torch.Tensor:
    with torch.inference_mode():
        return torch.randn(n)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("context", [contextlib.nullcontext, torch.no_grad, torch.inference_mode],
                         ids=["grad", "no_grad", "inference_mode"])
@pytest.mark.parametrize("numel", [10, 300_000])
@pytest.mark.parametrize("source", ["normal", "inference"])
@pytest.mark.parametrize("twice", [False, True], ids=["once", "twice"])
def test_inference_data_in_a_normal_tensor_is_bumped_as_stock(entry, context, numel, source, twice):
    # Stock bumps such a destination like any other (its counter is there) and raises nothing,
    # except inside inference_mode with an inference source: no tensor of that pair carries the
    # ADInplaceOrView key then. Listed twice (stock's loop), the bumps must add up.
    def call(fn):
        torch.manual_seed(1)
        b = _inference_data(numel)
        make = torch.randn if source == "normal" else _inference_source
        d = [torch.zeros(numel), b, torch.zeros(numel)] + ([b] if twice else [])
        s = [torch.randn(numel), make(numel), torch.randn(numel)] + ([make(numel)] if twice else [])
        with context():
            fn(d, s)
        return [t._version for t in d], [storage_bytes(t) for t in d]

    want, got = call(torch._foreach_copy_), call(entry)
    assert got[0] == want[0]
    moved = 0 if source == "inference" and context is torch.inference_mode else (2 if twice else 1)
    assert want[0] == [1, moved, 1] + ([moved] if twice else [])
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
def test_counterless_destinations_in_a_run_the_kernel_cannot_copy(entry):
    # Adjacent views without a version counter form one coalesced run; int32 -> float32 is no
    # kernel op, so the run goes to stock's op, whose fused-kernel probe must skip them.
    def call(fn):
        base = torch.zeros(12)
        d = [_no_version_counter(6), _no_version_counter(6)]
        d[0].data, d[1].data = base[:6], base[6:]
        src = torch.arange(12, dtype=torch.int32)
        with torch.inference_mode():
            fn(d, [src[:6], src[6:]])
        return base

    assert torch.equal(call(entry), call(torch._foreach_copy_))
