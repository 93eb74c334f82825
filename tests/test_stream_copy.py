"""Passes beyond the last-level cache copy their bytes with streaming stores (csrc/cpu/byte_copy.h):
bitwise stock's result at any alignment, through every entry, nothing written outside the
destinations, and only where the call's bytes read plus written reach the threshold. The
foreach kernel's conversions never stream; chunk_cat's widening casts do."""
from __future__ import annotations

import os

import pytest
import torch

import npu_dispatch as nd
from npu_dispatch import _native
from cases import direct_copy, mode_copy, op_copy, stock_copy

if not _native.available():
    if os.environ.get("NPU_DISPATCH_REQUIRE_NATIVE") == "1":
        pytest.fail(f"native library required: {_native.status()[1]}", pytrace=False)
    pytest.skip(f"native library not built: {_native.status()[1]}", allow_module_level=True)

THRESHOLD = _native.info()["stream_moved_bytes"]
if THRESHOLD > 512 << 20:
    # INT64_MAX: no AVX2 streaming stores on this CPU (csrc/cpu/byte_copy.h).
    pytest.skip(f"streaming starts at {THRESHOLD} bytes moved here: never, or too many to test",
                allow_module_level=True)

# Elements of a known pattern before and after every destination: a write outside it shows.
GUARD = 5


def counter(name: str) -> int:
    return _native.info()[name]


def random_bytes(n: int, seed: int) -> torch.Tensor:
    """`n` random bytes: as fp32 or bf16 they hold NaN payloads, -0.0 and subnormals too."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def guarded(size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(a destination of `size` elements, the buffer holding it between GUARD elements of 0xA5)."""
    buf = torch.full(((size + 2 * GUARD) * dtype.itemsize,), 0xA5, dtype=torch.uint8).view(dtype)
    return buf[GUARD:GUARD + size], buf


def odd_pairs(dst_bytes: int, pairs: int, dtype: torch.dtype, seed: int, views: bool = False):
    """(dsts, srcs, buffers holding the dsts): `pairs` pairs of `dtype`, about `dst_bytes`
    destination bytes, at element offsets that move their addresses off cache-line alignment,
    of odd lengths; with `views`, split views of one source and one destination buffer (a
    coalesced run)."""
    item = dtype.itemsize
    # Lengths n, n + 2, ...: together within `pairs` elements of dst_bytes.
    n = max((dst_bytes // item - pairs * (pairs - 1)) // pairs, 1) | 1
    sizes = [n + 2 * k for k in range(pairs)]
    if views:
        total = sum(sizes)
        src = random_bytes((total + 3) * item, seed).view(dtype)[3:]
        dst, buf = guarded(total, dtype)
        return list(dst.split(sizes)), list(src.split(sizes)), [buf]
    srcs, dsts, bufs = [], [], []
    for k, size in enumerate(sizes):
        off = 1 + k % 7
        srcs.append(random_bytes((size + off) * item, seed + k).view(dtype)[off:])
        dst, buf = guarded(size, dtype)
        dsts.append(dst)
        bufs.append(buf)
    return dsts, srcs, bufs


def assert_as_stock(entry, make):
    """`make()` builds the same pairs afresh each call: stock copies one set, `entry` the other;
    whole buffers (guards included) and version counters must agree. Returns `entry`'s dsts."""
    want, srcs, want_bufs = make()
    stock_copy(want, srcs)
    dsts, srcs, bufs = make()
    entry(dsts, srcs)
    for b, w in zip(bufs, want_bufs):
        assert torch.equal(b.view(torch.uint8), w.view(torch.uint8))
    assert [d._version for d in dsts] == [w._version for w in want]
    return dsts


ENTRIES = {"direct": direct_copy, "op": op_copy, "mode": mode_copy}
# (pairs, views): a short list, a long one, a coalesced run.
LISTS = pytest.mark.parametrize("pairs,views", [(3, False), (130, False), (130, True)],
                                ids=["3 pairs", "130 pairs", "130 views"])


@pytest.mark.parametrize("entry", ENTRIES)
@LISTS
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32])
def test_a_call_beyond_the_cache_streams_stocks_bytes(entry, pairs, views, dtype):
    make = lambda: odd_pairs(THRESHOLD // 2 + 4096, pairs, dtype, seed=pairs, views=views)  # noqa: E731
    streamed = counter("kernel_streamed_bytes")
    dsts = assert_as_stock(ENTRIES[entry], make)
    assert 2 * sum(d.nbytes for d in dsts) >= THRESHOLD
    assert counter("kernel_streamed_bytes") - streamed == sum(d.nbytes for d in dsts)


@pytest.mark.parametrize("entry", ENTRIES)
@LISTS
def test_a_call_under_the_cache_does_not_stream(entry, pairs, views):
    # Read plus written just under the threshold: normal stores, the bytes stay in cache.
    make = lambda: odd_pairs(THRESHOLD // 2 - 64 * 1024, pairs, torch.float32, seed=7, views=views)  # noqa: E731
    streamed, passes = counter("kernel_streamed_bytes"), counter("kernel_passes")
    dsts = assert_as_stock(ENTRIES[entry], make)
    assert 2 * sum(d.nbytes for d in dsts) < THRESHOLD
    assert counter("kernel_passes") > passes  # the kernel copied it
    assert counter("kernel_streamed_bytes") == streamed


def test_conversions_beyond_the_cache_do_not_stream_and_byte_copies_beside_them_do():
    def make():
        casts_d, casts_s, casts_b = odd_pairs(THRESHOLD // 2, 2, torch.bfloat16, seed=11)
        same_d, same_s, same_b = odd_pairs(THRESHOLD // 4, 2, torch.float32, seed=12)
        # fp32 -> bf16, NaN payloads included, beside fp32 byte copies.
        return casts_d + same_d, [s.float() for s in casts_s] + same_s, casts_b + same_b

    streamed, items = counter("kernel_streamed_bytes"), counter("kernel_items")
    dsts = assert_as_stock(direct_copy, make)
    assert counter("kernel_items") - items == 4  # one pass copied all four pairs
    assert counter("kernel_streamed_bytes") - streamed == sum(d.nbytes for d in dsts[2:])


def test_all_gather_copy_in_beyond_the_cache_streams_stocks_bytes():
    import torch.distributed.fsdp  # noqa: F401  registers fsdp::all_gather_copy_in

    world, rank = 2, 1
    inputs = [random_bytes(n * 2, n).view(torch.bfloat16) for n in (THRESHOLD // 8 + 1, THRESHOLD // 8 + 3, 5)]
    sizes = [t.numel() for t in inputs]
    numel = sum(sizes)
    want_out = torch.zeros(world * numel, dtype=torch.bfloat16)
    torch.ops.fsdp.all_gather_copy_in(inputs, want_out, sizes, numel, rank)
    out = torch.zeros(world * numel, dtype=torch.bfloat16)
    streamed = counter("kernel_streamed_bytes")
    got_in, got_out = nd.all_gather_copy_in(inputs, out, sizes, numel, rank)
    assert got_out is out and got_in.data_ptr() == out.data_ptr() + numel * rank * 2
    assert torch.equal(out.view(torch.uint8), want_out.view(torch.uint8))
    assert counter("kernel_streamed_bytes") - streamed == numel * 2


@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)],
                         ids=["bf16->fp32", "bf16"])
@pytest.mark.parametrize("world", [8, 3])
def test_chunk_cat_beyond_the_cache_streams_stocks_bits(dtypes, world):
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  registers fsdp::chunk_cat

    src_dt, out_dt = dtypes
    # Read plus written just over the threshold, in gradients of odd lengths at odd offsets (the
    # padding and unaligned pieces), one of them 2-D.
    per = src_dt.itemsize + out_dt.itemsize
    big = THRESHOLD // per // 2 + 4097
    raw = [random_bytes((n + off) * src_dt.itemsize, n).view(src_dt)[off:] for n, off in ((big, 3), (big + 2, 1), (77, 5))]
    tensors = raw[:2] + [raw[2][:76].view(19, 4)]
    width = sum(-(-t.shape[0] // world) * (t[0].numel() if t.dim() > 1 else 1) for t in tensors)
    want, want_buf = guarded(world * width, out_dt)
    torch.ops.fsdp.chunk_cat(tensors, 0, world, out=want.view(world, width))
    out, buf = guarded(world * width, out_dt)
    streamed = counter("kernel_streamed_bytes")
    with nd.NpuFastCopyMode() as mode:
        torch.ops.fsdp.chunk_cat(tensors, 0, world, out=out.view(world, width))
    assert mode.stats.total_fallback_calls == 0
    assert torch.equal(buf.view(torch.uint8), want_buf.view(torch.uint8))
    assert sum(t.nbytes for t in tensors) + out.nbytes >= THRESHOLD
    # The whole out in a streaming pass, unless the cast's conversion variant has no streaming
    # stores (DEFAULT: it stores normally).
    variant = (_native.self_check_result() or {}).get("bf16->f32", {}).get("variant")
    streams = src_dt == out_dt or variant in ("AVX2", "AVX512")
    assert counter("kernel_streamed_bytes") - streamed == (out.nbytes if streams else 0)
