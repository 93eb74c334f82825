"""Graphs and inputs shared by the lowering tests: FSDP2's copy-in as torch.compile sees it."""
from __future__ import annotations

import torch
import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  defines fsdp::


def shards(sizes, seed=0):
    """fp32 shards with values that stress rounding: NaN, +-inf, subnormals, bf16 ties, big/small."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k, n in enumerate(sizes):
        s = torch.randn(n, generator=gen) * 10.0 ** torch.randint(-6, 6, (n,), generator=gen)
        special = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-40, -0.0, 1.00390625, 3.0e38])
        m = min(n, special.numel())
        s[(k * 3) % max(1, n - m + 1):][:m] = special[:m]
        out.append(s)
    return out


def fsdp_copy_in(sizes, rank, world, dtype):
    """``f(shards, out)``: FSDP2's copy-in for all-gather output ``dtype``.

    bf16 / fp32: mixed-precision path, fp32 shards ``_foreach_copy_``'d into ``torch.split`` views
    of one flat ``dtype`` buffer, then ``fsdp.all_gather_copy_in`` of those views. uint8: the path
    FSDP takes for mixed input dtypes, shards viewed as bytes. Returns ``(f, split sizes, numel)``
    in output elements.
    """
    split = [4 * s for s in sizes] if dtype == torch.uint8 else list(sizes)
    numel = sum(split)

    def f(shard_list, out):
        if dtype == torch.uint8:
            inputs = [s.view(torch.uint8) for s in shard_list]
        else:
            flat = torch.empty(numel, dtype=dtype)
            inputs = torch.split(flat, split)
            torch._foreach_copy_(inputs, shard_list)
        return torch.ops.fsdp.all_gather_copy_in(inputs, out, split, numel, rank)

    return f, split, numel


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, nan_payload: bool = True) -> None:
    """Every byte equal; with ``nan_payload=False``, NaN positions must match but their payload may
    not: a narrowing float cast (fp32 -> bf16) writes 0xFFFF from ATen's and Inductor's vectorized
    conversion and 0x7FC0 from the scalar one, which Inductor's C++ backend picks for tiny loops."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if nan_payload or not got.dtype.is_floating_point:
        assert torch.equal(bits(got), bits(want)), "differs bitwise from eager stock"
        return
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "NaN positions differ from eager stock"
    assert torch.equal(bits(got[~nan]), bits(want[~nan])), "differs bitwise from eager stock"
