"""Builders for copy cases, run twice (stock, then ours) from one seed, and bitwise comparison.

A case is plain data (hypothesis draws it); ``build(case)`` makes fresh tensors from it, so stock
and the fast path each start from identical, independently allocated inputs.
"""
from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from hypothesis import strategies as st

import npu_dispatch as nd


# The Python dispatch-mode path (npu_dispatch/mode.py) instead of the C++ interception: what
# tests/test_python_path.py runs the semantic tests under. Tests of the interception's own
# mechanics (which kernel ran, no mode pushed, what each path counts) skip there.
PYTHON_PATH = os.environ.get("NPU_DISPATCH_INTERCEPTION") == "0"
interception_only = pytest.mark.skipif(
    PYTHON_PATH, reason="checks the C++ interception's own mechanics; this run takes the Python dispatch-mode path")


def require_native(distributed: bool = False) -> None:
    """A test module's gate, called at import: skipped with its reason without torch.distributed
    (where `distributed`) or without the native library; where CI requires the library
    (NPU_DISPATCH_REQUIRE_NATIVE=1) its absence fails instead of skipping."""
    from npu_dispatch import _native

    if distributed and not torch.distributed.is_available():
        pytest.skip("torch built without distributed", allow_module_level=True)
    if not _native.available():
        if os.environ.get("NPU_DISPATCH_REQUIRE_NATIVE") == "1":
            pytest.fail(f"native library required: {_native.status()[1]}", pytrace=False)
        pytest.skip(f"native library not built: {_native.status()[1]}", allow_module_level=True)


def _reduce_scatter_copy_in() -> str:
    """The op FSDP2 of this torch issues for its reduce-scatter copy-in: fsdp.chunk_cat_mixed_dtype
    from torch 2.15 (fsdp.chunk_cat is kept there but not called), fsdp.chunk_cat before."""
    import importlib

    import torch

    if not torch.distributed.is_available():
        return "fsdp.chunk_cat"
    importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_collectives")
    return "fsdp.chunk_cat_mixed_dtype" if hasattr(torch.ops.fsdp, "chunk_cat_mixed_dtype") else "fsdp.chunk_cat"


RS_COPY_IN = _reduce_scatter_copy_in()


# ---- the entries compared with stock ----------------------------------------------------------


def stock_copy(dsts, srcs):
    torch._foreach_copy_(dsts, srcs)


def direct_copy(dsts, srcs):
    nd.foreach_copy_(dsts, srcs)


def op_copy(dsts, srcs):
    # Through the dispatcher: the op's kernels (C++ on CPU once the native library loads).
    torch.ops.npu_dispatch.foreach_copy_.default(dsts, srcs)


def mode_copy(dsts, srcs):
    with nd.NpuFastCopyMode():
        torch._foreach_copy_(dsts, srcs)


def one_pass_calls() -> int:
    """Calls the native one-pass plan has run (csrc/planner/one_pass.h): which way a call went."""
    from npu_dispatch import _native

    return _native.info()["one_pass_calls"]


FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
OTHERS = [torch.bool, torch.complex64, torch.complex128]
DTYPES = FLOATS + INTS + OTHERS
LAYOUTS = ["contiguous", "transposed", "strided", "channels_last", "broadcast", "size1_strides"]

# Bit patterns that must survive exactly: NaN payloads (quiet, signalling, negative), -0.0,
# subnormals, infinities; for fp32, values halfway between two bf16 (rounding ties, to even down
# and up).
_SPECIAL_BITS = {
    4: [0x7FC00000, 0x7F800001, 0xFFC12345, 0x7FA5A5A5, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F800000, 0xFF800000,
        0x3F808000, 0x3F818000, 0xC0808000],
    2: [0x7E00, 0x7C01, 0xFE5A, 0x7FC1, 0xFFC0, 0x8000, 0x0001, 0x83FF, 0x7F80, 0xFF80],
    8: [0x7FF8000000000001, 0xFFF0000000000123, 0x8000000000000000, 0x0000000000000001, 0x7FF0000000000000],
}


@dataclasses.dataclass(frozen=True)
class Pair:
    shape: tuple[int, ...]
    src_dtype: torch.dtype
    dst_dtype: torch.dtype
    dst_layout: str
    src_layout: str


@dataclasses.dataclass(frozen=True)
class Case:
    pairs: tuple[Pair, ...]
    dst_adjacent: bool  # consecutive same-dtype contiguous destinations carved from one buffer
    src_adjacent: bool
    alias: tuple[tuple[int, int], ...]  # (i, j): src[i] is dst[j] (when shapes allow)
    seed: int


def _signed(bits: int, size: int) -> int:
    return bits - (1 << (8 * size)) if bits >= 1 << (8 * size - 1) else bits


# _SPECIAL_BITS as signed words, each list twice over: the k-th pattern written is _SPECIAL_WORDS[k].
_WORD_DTYPES = {2: torch.int16, 4: torch.int32, 8: torch.int64}
_SPECIAL_WORDS = {size: torch.tensor([_signed(b, size) for b in pats] * 2, dtype=_WORD_DTYPES[size])
                  for size, pats in _SPECIAL_BITS.items()}


def _fill(t: torch.Tensor, gen: "torch.Generator | Draws") -> None:
    """Random bits plus special patterns, written through the tensor's whole storage (drawn from
    ``gen``, or what a Draws gives)."""
    if isinstance(gen, Draws):
        gen.fill(t)
        return
    _draw(t, gen)


def _draw(t: torch.Tensor, gen: torch.Generator) -> None:
    raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    if raw.numel() == 0:
        return
    # In place: the same draws as torch.randint(0, high, raw.shape, generator=gen) copied in.
    raw.random_(0, 2 if t.dtype == torch.bool else 256, generator=gen)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        size = t.element_size() if t.dtype.is_floating_point else t.element_size() // 2
        words = (raw if raw.numel() % size == 0 else raw[: raw.numel() // size * size]).view(_WORD_DTYPES[size])
        pats = _SPECIAL_WORDS[size]
        k = min(words.numel(), pats.numel())
        # The first k patterns (cycling through the list) at k distinct random words, in one write.
        words.index_copy_(0, torch.randperm(words.numel(), generator=gen)[:k], pats[:k])


class Draws:
    """A seeded generator for several builds of the same inputs (``build(case, draws)``, or any
    maker whose tensors _fill fills, handed this as its generator). The first build draws from
    ``torch.Generator().manual_seed(seed)`` and records the bytes each storage got, in order; each
    later one copies those bytes back instead of drawing them again. So every build gets what a
    fresh generator of that seed gives (identical, independently allocated inputs) in a fraction
    of the time."""

    def __init__(self, seed: int):
        self.seed = seed
        self._gen = torch.Generator().manual_seed(seed)
        self._bytes: list = []
        self._builds = 0
        self._next = None  # None: the first build, drawing and recording; else the next to copy back

    def start(self) -> "Draws":
        """Before each build."""
        self._builds += 1
        self._next = None if self._builds == 1 else 0
        return self

    def done(self) -> None:
        """After each build: a later build must have filled exactly what the first did."""
        assert self._next is None or self._next == len(self._bytes), "builds of one seed differ in their storages"

    def fill(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if self._next is None:
            _draw(t, self._gen)
            self._bytes.append(storage.clone())
            return
        recorded = self._bytes[self._next]
        assert recorded.nbytes() == storage.nbytes(), "builds of one seed differ in their storages"
        storage.copy_(recorded)
        self._next += 1


def _make(shape, dtype, layout, gen, pool=None) -> torch.Tensor:
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        return _make(shape[:-2] + (shape[-1], shape[-2]), dtype, "contiguous", gen).transpose(-1, -2)
    if layout == "strided" and len(shape) >= 1:
        base = _make(shape[:-1] + (shape[-1] * 2,), dtype, "contiguous", gen)
        return base[..., ::2]
    if layout == "channels_last" and len(shape) == 4:
        return _make(shape, dtype, "contiguous", gen).contiguous(memory_format=torch.channels_last)
    if layout == "size1_strides" and 1 in shape:
        # Same sizes as contiguous, odd strides on size-1 dims: the fast route ignores those.
        base = _make(shape, dtype, "contiguous", gen)
        strides = [s if n != 1 else 7 for n, s in zip(shape, base.stride())]
        return base.as_strided(shape, strides)
    if pool is not None:
        return pool(shape, dtype)
    t = torch.empty(shape, dtype=dtype)
    _fill(t, gen)
    return t


def build(case: Case, draws: Draws | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Fresh (dsts, srcs, storages to compare) for ``case``; ``draws``: a ``Draws(case.seed)``
    shared by several builds of the case, the same tensors drawn once."""
    if draws is not None:
        assert draws.seed == case.seed
    gen = torch.Generator().manual_seed(case.seed) if draws is None else draws.start()
    pools = {}

    def pooled(kind):
        # All adjacent destinations (or sources) of one dtype come from one buffer, in order.
        def take(shape, dtype):
            key = (kind, dtype)
            if key not in pools:
                total = sum(
                    math.prod(p.shape)
                    for p in case.pairs
                    if (p.dst_dtype if kind == "dst" else p.src_dtype) == dtype
                )
                buf = torch.empty(total, dtype=dtype)
                _fill(buf, gen)
                pools[key] = [buf, 0]
            buf, off = pools[key]
            n = math.prod(shape)
            pools[key][1] = off + n
            return buf[off: off + n].view(shape)
        return take

    dsts, srcs = [], []
    for p in case.pairs:
        dpool = pooled("dst") if case.dst_adjacent and p.dst_layout == "contiguous" else None
        dsts.append(_make(p.shape, p.dst_dtype, p.dst_layout, gen, dpool))
        if p.src_layout == "broadcast":
            sshape = tuple(1 if k % 2 == 0 else n for k, n in enumerate(p.shape))[-max(len(p.shape) - 1, 0):] or ()
            srcs.append(_make(sshape, p.src_dtype, "contiguous", gen))
        else:
            spool = pooled("src") if case.src_adjacent and p.src_layout == "contiguous" else None
            srcs.append(_make(p.shape, p.src_dtype, p.src_layout, gen, spool))
    for i, j in case.alias:
        if i < len(srcs) and j < len(dsts) and dsts[j].shape == dsts[i].shape:
            srcs[i] = dsts[j]
    if draws is not None:
        draws.done()
    _bound_undefined(dsts, srcs)
    storages = list({id(t.untyped_storage()): t for t in dsts + srcs}.values())
    return dsts, srcs, storages


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).clone()


def shard_bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor or of a DTensor's local shard (FSDP2's parameters and gradients)."""
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.detach().reshape(-1).view(torch.uint8).clone()


def same_shards(a, b) -> bool:
    """Bitwise equality of two lists of tensors or local shards (None matching None only)."""
    return len(a) == len(b) and all((x is None) == (y is None) and (x is None or torch.equal(shard_bits(x), shard_bits(y)))
                                    for x, y in zip(a, b))


def bits(t: torch.Tensor) -> torch.Tensor:
    # A fresh contiguous copy: .contiguous() keeps odd strides on size-1 dims, which view() rejects.
    flat = t.detach().reshape(-1).clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


# Stock's CPU copy of a 0-dim fp32 tensor into a 0-dim bf16 one reads its TensorIterator's strides
# out of bounds (torch 2.13, reduced_float_type_copy in aten/src/ATen/native/cpu/CopyKernel.cpp
# indexes strides(0)[0] of an iterator with no dimensions; valgrind: "depends on uninitialised
# value(s) ... created by a stack allocation at copy_impl"). Stale stack memory then picks the
# vectorized conversion (a NaN becomes 0xffff) or the scalar one (0x7fc0), so stock itself writes
# either for the same input, depending on what ran before it (docs/stock_quirks.md).
STOCK_EITHER = (0x7FC0, 0xFFFF)


def _zero_dim_casts(dsts, srcs) -> list[int]:
    return [k for k, (d, s) in enumerate(zip(dsts, srcs))
            if d.dim() == 0 and s.dim() == 0 and d.dtype == torch.bfloat16 and s.dtype == torch.float32]


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _reads(s: torch.Tensor, d: torch.Tensor) -> bool:
    """Whether source ``s`` can read any byte of destination ``d``'s element span."""
    def span(t):
        last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
        return t.storage_offset() * t.element_size(), (last + 1) * t.element_size()

    if not s.numel() or _storage_ptr(s) != _storage_ptr(d):
        return False
    return span(s)[0] < span(d)[1] and span(d)[0] < span(s)[1]


def _bound_undefined(dsts, srcs) -> None:
    """Keep stock's undefined bits where the comparison can bound them (_stock_undefined): a 0-dim
    bf16 destination that already holds one of stock's two encodings could hide a pair left
    unwritten, so it starts at zero; one that a source of the call reads would carry those bits
    on into other tensors, so its own source becomes a finite 1.0."""
    for k in _zero_dim_casts(dsts, srcs):
        word = dsts[k].view(torch.int16)
        if (int(word) & 0xFFFF) in STOCK_EITHER:
            word.fill_(0)
        if any(_reads(s, dsts[k]) for s in srcs):
            srcs[k].fill_(1.0)


def _stock_undefined(dsts, srcs, storages) -> tuple[list[tuple[int, int]], list[int]]:
    """Where stock's bits are not defined: ((storage index, byte offset), ...) and the pair indices
    of 0-dim fp32 -> bf16 destinations, less those a source of the call reads (an alias: their
    bits would travel on, so _bound_undefined gave them a finite source and they compare
    strictly)."""
    picked = [k for k in _zero_dim_casts(dsts, srcs) if not any(_reads(s, dsts[k]) for s in srcs)]
    index = {_storage_ptr(t): n for n, t in enumerate(storages)}
    return [(index[_storage_ptr(dsts[k])], dsts[k].storage_offset() * 2) for k in picked], picked


def run(case: Case, fn, draws: Draws | None = None) -> dict:
    """Build ``case`` (from ``draws``, see build), call ``fn(dsts, srcs)``, and capture everything
    observable."""
    dsts, srcs, storages = build(case, draws)
    undefined = _stock_undefined(dsts, srcs, storages)
    try:
        out = fn(dsts, srcs)
        error = None
    except Exception as e:  # compared against stock's, type and message
        out, error = None, (type(e), str(e))
    return {
        "error": error,
        "storages": [storage_bytes(t) for t in storages],
        "dst_versions": [d._version for d in dsts],
        "src_versions": [s._version for s in srcs],
        "out": [bits(t) for t in out] if isinstance(out, (list, tuple)) else None,
        "out_strides": [t.stride() for t in out] if isinstance(out, (list, tuple)) else None,
        "out_versions": [t._version for t in out] if isinstance(out, (list, tuple)) else None,
        "undefined": undefined,
    }


def mode_paths(make, *, direct: bool = False) -> tuple[dict, dict]:
    """(paths, fallback reasons) of ``NpuFastCopyMode``'s stats for one
    ``torch._foreach_copy_(*make())`` (``direct``: ``npu_dispatch.foreach_copy_``, its direct entry's
    one-pass plan). A call that raises counts what it did before
    raising."""
    mode = nd.NpuFastCopyMode()
    with mode:
        dsts, srcs = make()
        try:
            (nd.foreach_copy_ if direct else torch._foreach_copy_)(dsts, srcs)
        except RuntimeError:
            pass
    s = mode.stats.as_dict()
    return s["paths"], s["fallback_reasons"]


def plan_paths(make) -> tuple[dict, dict]:
    """What the full planner's plan (``explain``, no one-pass plan) would count for
    ``torch._foreach_copy_(*make())``, in ``mode_paths``' layout."""
    from npu_dispatch.stats import paths as all_paths

    dsts, srcs = make()
    p = nd.explain(dsts, srcs)
    nbytes = lambda idx: sum(dsts[i].numel() * dsts[i].element_size() for i in idx)  # noqa: E731
    used = {}
    reasons = {}
    if p.stock_reason is not None:
        reasons[p.stock_reason[0]] = p.n
        used["stock"] = (p.n, nbytes(range(p.n)), p.n)
    else:
        if p.runs:
            used["coalesced"] = (sum(len(r.indices) for r in p.runs),
                                 sum(r.numel * dsts[r.indices[0]].element_size() for r in p.runs), len(p.runs))
        if p.groups:
            idx = [i for g in p.groups for i in g.indices]
            used["foreach"] = (len(idx), nbytes(idx), sum(g.launches for g in p.groups))
        if p.fallback:
            used["fallback"] = (len(p.fallback), nbytes(p.fallback), p.fallback_launches)
            for i in p.fallback:
                reasons[p.reasons[i][0]] = reasons.get(p.reasons[i][0], 0) + 1
        if p.empty:
            used["empty"] = (len(p.empty), 0, 0)
    paths = {}
    for k in all_paths():
        pairs, nbytes_, launches = used.get(k, (0, 0, 0))
        paths[k] = {"calls": int(k in used), "pairs": pairs, "tensors": pairs, "bytes": nbytes_, "launches": launches}
    return paths, reasons


def assert_stock_error(make, entry, text: str) -> None:
    """``entry(*make())`` raises the RuntimeError ``stock_copy(*make())`` raises, containing ``text``."""
    import pytest

    errors = []
    for fn in (stock_copy, entry):
        with pytest.raises(RuntimeError) as info:
            fn(*make())
        errors.append(str(info.value))
    assert errors[0] == errors[1] and text in errors[0]


def _either(a: torch.Tensor, b: torch.Tensor, offset: int) -> None:
    """Blank the bf16 at byte ``offset`` of the byte tensors ``a`` and ``b``, in place, where both
    hold one of stock's two encodings of that NaN (STOCK_EITHER), so the rest still compares
    bitwise."""
    words = [int.from_bytes(bytes(t[offset:offset + 2].tolist()), "little") for t in (a, b)]
    if all(w in STOCK_EITHER for w in words):
        a[offset:offset + 2] = 0
        b[offset:offset + 2] = 0


def assert_same(stock: dict, ours: dict) -> None:
    """Everything observable matches bitwise, except where stock's own bits are undefined
    (_stock_undefined): there either of stock's two NaN encodings passes."""
    assert ours["error"] == stock["error"]
    assert len(ours["storages"]) == len(stock["storages"])
    positions, pairs = stock.get("undefined", ([], []))
    a_st, b_st = [t.clone() for t in stock["storages"]], [t.clone() for t in ours["storages"]]
    for k, offset in positions:
        _either(a_st[k], b_st[k], offset)
    for k, (a, b) in enumerate(zip(a_st, b_st)):
        assert torch.equal(a, b), f"storage {k} differs bitwise from stock"
    assert ours["dst_versions"] == stock["dst_versions"]
    assert ours["src_versions"] == stock["src_versions"]
    if stock["out"] is not None:
        assert ours["out_strides"] == stock["out_strides"]
        assert ours["out_versions"] == stock["out_versions"]
        for k, (a, b) in enumerate(zip(stock["out"], ours["out"])):
            if k in pairs:
                a, b = a.clone(), b.clone()
                _either(a, b, 0)
            assert torch.equal(a, b)


# ---- hypothesis strategies -------------------------------------------------------------------

shapes = st.one_of(
    st.tuples(st.integers(0, 40)),
    st.tuples(st.integers(0, 6), st.integers(0, 9)),
    st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3)),
    st.just(()),
    st.just((1, 5, 1)),
)


@st.composite
def pairs(draw, same_dtype_bias=True):
    shape = draw(shapes)
    src = draw(st.sampled_from(DTYPES))
    dst = src if draw(st.booleans()) else draw(st.sampled_from(DTYPES))
    contig = st.just("contiguous")
    dl = draw(st.one_of(contig, contig, st.sampled_from(["transposed", "strided", "channels_last", "size1_strides"])))
    sl = draw(st.one_of(contig, contig, st.sampled_from(LAYOUTS)))
    return Pair(shape, src, dst, dl, sl)


@st.composite
def cases(draw, max_len=300):
    n = draw(st.integers(1, max_len))
    # Lists share a handful of pair templates so long lists stay cheap to draw, as real
    # parameter lists do.
    templates = draw(st.lists(pairs(), min_size=1, max_size=6))
    picks = draw(st.lists(st.integers(0, len(templates) - 1), min_size=n, max_size=n))
    alias = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2)) if draw(st.integers(0, 4)) == 0 else []
    return Case(
        pairs=tuple(templates[k] for k in picks),
        dst_adjacent=draw(st.booleans()),
        src_adjacent=draw(st.booleans()),
        alias=tuple(alias),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@st.composite
def one_pass_cases(draw, min_len=1, max_len=60):
    """Mostly one-pass-eligible lists (contiguous, one-pass dtype pairs, adjacency), some with a rogue pair
    (broadcast, transposed, unsupported cast) or an alias that sends them to the planner."""
    f32, f16, bf16, i32 = torch.float32, torch.float16, torch.bfloat16, torch.int32
    dtype_pairs = [(f32, f32), (bf16, bf16), (f16, f16), (i32, i32), (f32, bf16), (bf16, f32), (f32, f16), (f16, f32)]
    shape = st.one_of(st.tuples(st.integers(0, 70)), st.tuples(st.integers(1, 4), st.integers(0, 9)))
    templates = draw(st.lists(st.tuples(shape, st.sampled_from(dtype_pairs)), min_size=1, max_size=4))
    n = draw(st.integers(min_len, max_len))
    picks = draw(st.lists(st.sampled_from(templates), min_size=n, max_size=n))
    pairs = [Pair(s, a, b, "contiguous", "contiguous") for s, (a, b) in picks]
    if draw(st.integers(0, 5)) == 0:
        k = draw(st.integers(0, n - 1))
        rogue = draw(st.sampled_from(["transposed_dst", "broadcast", "int_cast"]))
        s = pairs[k].shape if len(pairs[k].shape) == 2 else (2, 3)
        pairs[k] = {
            "transposed_dst": Pair(s, f32, f32, "transposed", "contiguous"),
            "broadcast": Pair(s, f32, f32, "contiguous", "broadcast"),
            "int_cast": Pair(s, i32, f32, "contiguous", "contiguous"),
        }[rogue]
    alias = [(draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1)))] if draw(st.integers(0, 6)) == 0 else []
    return Case(tuple(pairs), draw(st.booleans()), draw(st.booleans()), tuple(alias), draw(st.integers(0, 2**31 - 1)))


def run_side_by_side(commands: dict, folder, timeout: float) -> dict:
    """``{name: CompletedProcess}`` for ``{name: argv}``, every process started at once (output to
    files in ``folder``, so no pipe fills) and each killed if still running after ``timeout``."""
    import subprocess

    started = {}
    try:
        for name, argv in commands.items():
            out, err = open(folder / f"{name}.out", "w+"), open(folder / f"{name}.err", "w+")
            started[name] = (subprocess.Popen(argv, stdout=out, stderr=err, text=True), out, err)
        for proc, _, _ in started.values():
            proc.wait(timeout=timeout)
    finally:
        for proc, _, _ in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    done = {}
    for name, (proc, out, err) in started.items():
        out.seek(0)
        err.seek(0)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())
        out.close()
        err.close()
    return done
