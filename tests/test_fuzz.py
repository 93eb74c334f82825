"""A differential fuzzer: every copy the mode owns, stock against the mode and the direct op.

Each test draws ``NPU_DISPATCH_FUZZ_CALLS`` (default 5,000) random calls in one process, so state
carried from one call to the next shows, and compares everything observable with stock's op run
on an identical fresh build of the same inputs (drawn once per call, then copied into each fresh
build: cases.Draws): every byte of every storage the call could touch,
the error (type and message), version counters, returned tensors (bits, strides, whether they are
views of the output) and, where sources require grad, the gradients stock's graph gives.

Inputs: every dtype pair, NaN payloads (signalling too), +-inf, -0.0, subnormals and bf16 rounding
ties (cases._fill), 0-dim and empty tensors, aliasing and partial overlap, broadcast sources,
strided and transposed views, meta tensors, mismatched lists and wrong shapes.

The seed is printed and named in every failure; ``NPU_DISPATCH_FUZZ_SEED=<seed>`` replays a run.
"""
from __future__ import annotations

import math
import os
import random
import warnings

import pytest
import torch

import npu_dispatch as nd
from cases import DTYPES, FLOATS, LAYOUTS, RS_COPY_IN, Case, Draws, Pair, assert_same, bits, build, run
from cases import _fill as fill

CALLS = int(os.environ.get("NPU_DISPATCH_FUZZ_CALLS", "5000"))
SEED = int(os.environ.get("NPU_DISPATCH_FUZZ_SEED", str(random.SystemRandom().randrange(1 << 31))))
f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16


@pytest.fixture(autouse=True)
def _say_seed():
    print(f"npu_dispatch fuzz seed: {SEED} (NPU_DISPATCH_FUZZ_SEED={SEED} replays it)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stock's out= resize deprecation warnings, thousands of them
        yield


def _rng(name: str) -> random.Random:
    return random.Random(f"{SEED}:{name}")


def _fail(name: str, k: int, what: str, detail) -> str:
    return f"{name} call {k} of seed {SEED}: {what} differs from stock: {detail}"


# ---- aten._foreach_copy_ / aten._foreach_copy ---------------------------------------------------


def _random_case(rng: random.Random, k: int) -> Case:
    n = rng.choice([1, 1, 2, 3, 5, 8])
    templates = []
    for _ in range(rng.randint(1, 3)):
        shape = rng.choice([(), (0,), (1,), (3,), (2, 3), (3, 1), (2, 1, 3), (2, 3, 2, 2)])
        dtypes = FLOATS + [f32, bf16] * 2 if rng.random() < 0.8 else DTYPES
        templates.append(Pair(shape, rng.choice(dtypes), rng.choice(dtypes), rng.choice(LAYOUTS[:3] + ["contiguous"]),
                              rng.choice(LAYOUTS)))
    pairs = tuple(rng.choice(templates) for _ in range(n))
    alias = ((rng.randrange(n), rng.randrange(n)),) if rng.random() < 0.15 else ()
    return Case(pairs, rng.random() < 0.5, rng.random() < 0.3, alias, k)


def _mutate(rng: random.Random, dsts, srcs):
    """What build() does not make: partial overlap, mismatched lists, meta tensors, grad sources."""
    r = rng.random()
    if r < 0.04 and dsts:
        buf = torch.zeros(12)
        return [buf[:6], buf[3:9]], [torch.arange(6.0), torch.arange(6.0) * -1.5]
    if r < 0.07:
        return dsts, srcs[:-1] + [torch.zeros(2)] * rng.randint(0, 2)
    if r < 0.10:
        return [d.to("meta") for d in dsts], [s.to("meta") for s in srcs]
    if r < 0.15:
        return dsts, [s.detach().requires_grad_() if s.dtype.is_floating_point else s for s in srcs]
    return dsts, srcs


def _foreach_entries():
    def stock(d, s):
        torch._foreach_copy_(d, s)

    def mode(d, s):
        with nd.NpuFastCopyMode():
            torch._foreach_copy_(d, s)

    return stock, {"mode": mode, "direct": nd.foreach_copy_}


def _with_grads(fn):
    """fn, then the gradients a backward through the destinations gives each grad source."""
    def go(d, s):
        fn(d, s)
        outs = [t for t in d if t.grad_fn is not None]
        if outs:
            sum(t.double().sum() for t in outs).backward()
        return [None if not t.requires_grad else (None if t.grad is None else bits(t.grad)) for t in s]
    return go


def _outcome(fn, dsts, srcs):
    if any(t.is_meta for t in [*dsts, *srcs]):
        try:
            fn(dsts, srcs)
            return None, [tuple(t.shape) for t in dsts]
        except Exception as e:  # noqa: BLE001 - compared with stock's
            return (type(e), str(e)), None
    return None


def test_foreach_copy_matches_stock_over_random_calls():
    rng = _rng("foreach_copy_")
    stock, entries = _foreach_entries()
    for k in range(CALLS):
        case = _random_case(rng, k)
        mut = rng.random()
        draws = Draws(case.seed)  # one draw of the inputs; every build of this call copies it

        def make():
            d, s, storages = build(case, draws)
            d, s = _mutate(random.Random(mut), d, s)
            return d, s, storages

        # The first build is stock's: what it holds (meta tensors, grad sources) picks the comparison.
        first = make()
        d0, s0, _ = first
        if any(t.is_meta for t in [*d0, *s0]):
            want_meta = _outcome(stock, d0, s0)
            for name, fn in entries.items():
                d, s, _ = make()
                assert _outcome(fn, d, s) == want_meta, _fail(name, k, "meta call", case)
            continue
        grads = any(t.requires_grad for t in s0)
        want = _run(stock, lambda: first, grads)
        for name, fn in entries.items():
            got = _run(fn, make, grads)
            try:
                assert_same(want, got)
                assert got["grads"] == want["grads"]
            except AssertionError as e:
                raise AssertionError(_fail(name, k, "result", f"{case}\n{e}")) from None


def _run(fn, make, grads):
    d, s, storages = make()
    from cases import _stock_undefined

    undefined = _stock_undefined(d, s, storages)
    try:
        g = _with_grads(fn)(d, s) if grads else None
        error = None
    except Exception as e:  # noqa: BLE001 - compared with stock's
        g, error = None, (type(e), str(e))
    from cases import storage_bytes

    return {"error": error, "storages": [storage_bytes(t) for t in storages], "dst_versions": [t._version for t in d],
            "src_versions": [t._version for t in s], "out": None, "undefined": undefined,
            "grads": [None if x is None else x.tolist() for x in g] if g else g}


def test_functional_foreach_copy_matches_stock_over_random_calls():
    rng = _rng("foreach_copy")

    def mode(d, s):
        with nd.NpuFastCopyMode():
            return torch.ops.aten._foreach_copy.default(d, s)

    for k in range(CALLS):
        case = _random_case(rng, k)
        draws = Draws(case.seed)
        want = run(case, torch.ops.aten._foreach_copy.default, draws)
        got = run(case, mode, draws)
        try:
            assert_same(want, got)
        except AssertionError as e:
            raise AssertionError(_fail("mode", k, "result", f"{case}\n{e}")) from None


# ---- FSDP2's copies ------------------------------------------------------------------------------


def _fill(t: torch.Tensor, gen: torch.Generator | Draws) -> torch.Tensor:
    fill(t, gen)
    return t


def _tensor(shape, dtype, gen, layout="contiguous"):
    if layout == "strided" and len(shape) == 1:
        return _fill(torch.empty(shape[0] * 2, dtype=dtype), gen)[::2]
    return _fill(torch.empty(shape, dtype=dtype), gen)


def _bytes(t: torch.Tensor) -> bytes:
    return bits(t).numpy().tobytes()


def _observe(result, tensors):
    """Everything the call left: bytes and versions of the watched tensors, returned tensors."""
    error, ret = result
    seen = {"error": error, "bytes": [], "versions": [t._version if not t.is_inference() else None for t in tensors]}
    for t in tensors:
        seen["bytes"].append(None if t.is_meta else _bytes(t))
    if isinstance(ret, tuple):
        seen["ret"] = [(_bytes(r), r.stride(), r._base is tensors[-1] if r._base is not None else r is tensors[-1])
                       for r in ret]
    return seen


def _call(fn, args, kwargs):
    try:
        return None, fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - compared with stock's
        return (type(e), str(e)), None


def _fsdp_op(name):
    import importlib

    importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_collectives")
    return getattr(torch.ops.fsdp, name)


def _compare(name, make, stock, entries, rng, k, watch):
    draws = Draws(rng.randrange(1 << 30))  # stock's build draws the inputs, the others' copy them

    def build():
        args, kwargs = make(draws.start())
        draws.done()
        return args, kwargs

    args, kwargs = build()
    want = _observe(_call(stock, args, kwargs), watch(args, kwargs))
    for entry, fn in entries.items():
        args, kwargs = build()
        got = _observe(_call(fn, args, kwargs), watch(args, kwargs))
        assert got == want, _fail(f"{name} ({entry})", k, "result", f"args {args} kwargs {kwargs}")


def _in_mode(op):
    def go(*a, **kw):
        with nd.NpuFastCopyMode():
            return op(*a, **kw)
    return go


def test_all_gather_copy_in_matches_stock_over_random_calls():
    rng = _rng("all_gather_copy_in")
    op = _fsdp_op("all_gather_copy_in")
    for k in range(CALLS):
        sizes = [rng.choice([0, 1, 2, 5, 9]) for _ in range(rng.randint(1, 5))]
        world, rank = rng.randint(1, 4), None
        rank = rng.randrange(world)
        out_dt = rng.choice([f32, bf16, bf16])
        numel = sum(sizes)
        bad = rng.random()

        def make(gen):
            ins = [_tensor((n,), out_dt if rng_dt < 0.8 else f32, gen, "strided" if rng_layout < 0.1 else "contiguous")
                   for n, rng_dt, rng_layout in zip(sizes, dts, lays)]
            if bad < 0.05 and ins:
                ins[0] = _tensor((sizes[0] + 1,), out_dt, gen)
            out = _tensor((world * numel + (1 if bad > 0.97 else 0),), out_dt, gen)
            return (ins, out, sizes, numel, rank), {}

        dts = [rng.random() for _ in sizes]
        lays = [rng.random() for _ in sizes]
        _compare("fsdp.all_gather_copy_in", make, op, {"mode": _in_mode(op), "direct": nd.all_gather_copy_in},
                 rng, k, lambda a, kw: [*a[0], a[1]])


def test_split_with_sizes_copy_matches_stock_over_random_calls():
    rng = _rng("split_with_sizes_copy")
    op = _fsdp_op("split_with_sizes_copy")
    for k in range(CALLS):
        sizes = [rng.choice([0, 1, 3, 4, 7]) for _ in range(rng.randint(1, 5))]
        world = rng.randint(1, 4)
        dt = rng.choice([f32, bf16])
        bad = rng.random()
        dim = 1 if rng.random() < 0.9 else 0

        def make(gen):
            src = _tensor((world * sum(sizes),), dt, gen).view(world, -1)
            out = [_tensor((world, n), dt if bad > 0.05 else f32, gen) for n in sizes]
            if bad > 0.96 and out:
                out[0] = _tensor((world, sizes[0] + 1), dt, gen)
            if 0.9 < bad <= 0.93 and out:
                out[-1] = out[-1].t().contiguous().t() if world > 1 and sizes[-1] > 1 else out[-1]
            return (src, sizes, dim), {"out": out}

        _compare("fsdp.split_with_sizes_copy", make, op,
                 {"mode": _in_mode(op), "direct": lambda s, z, d, out: nd.split_with_sizes_copy(s, z, d, out=out)},
                 rng, k, lambda a, kw: [a[0], *kw["out"]])


def _chunk_cat_case(rng, mixed: bool):
    n = rng.randint(1, 5)
    nc = rng.randint(1, 4)
    post = rng.choice([(), (), (2,), (3,)])
    rows = [rng.randint(1, 7) for _ in range(n)]
    out_dt = rng.choice([f32, f32, bf16, f16]) if not mixed else f32
    # fp16 -> fp32: Ascend 910A's mixed precision (no bf16 there).
    # A mixed list with fp16 stays stock's on a CPU whose copy_ splits fp16 FBGEMM's way (its casts
    # are copy_'s): drawn in a fifth of the mixed calls, so most still reach the fast path.
    mixed_dts = [bf16, f16, f32] if rng.random() < 0.2 else [bf16, f32]
    in_dts = [rng.choice(mixed_dts) for _ in range(n)] if mixed else [rng.choice([bf16, f16, out_dt])] * n
    bad = rng.random()

    def make(gen):
        ts = [_tensor((r,) + post, d, gen) for r, d in zip(rows, in_dts)]
        width = sum(-(-r // nc) * max(1, math.prod(post)) for r in rows)
        out = _tensor((nc, width + (1 if bad > 0.96 else 0)), out_dt, gen)
        if bad < 0.03:
            out.requires_grad_()
        return (ts, 0, nc), {"out": out}

    return make


def test_chunk_cat_matches_stock_over_random_calls():
    rng = _rng("chunk_cat")
    op = _fsdp_op("chunk_cat")
    for k in range(CALLS):
        _compare("fsdp.chunk_cat", _chunk_cat_case(rng, False), op,
                 {"mode": _in_mode(op), "direct": lambda t, d, c, out: nd.chunk_cat(t, d, c, out=out)},
                 rng, k, lambda a, kw: [*a[0], kw["out"]])


@pytest.mark.skipif(RS_COPY_IN != "fsdp.chunk_cat_mixed_dtype", reason="fsdp::chunk_cat_mixed_dtype is torch 2.15's")
def test_chunk_cat_mixed_dtype_matches_stock_over_random_calls():
    rng = _rng("chunk_cat_mixed_dtype")
    op = _fsdp_op("chunk_cat_mixed_dtype")
    mode = nd.NpuFastCopyMode()
    for k in range(CALLS):
        def in_mode(*a, **kw):
            with mode:
                return op(*a, **kw)
        _compare("fsdp.chunk_cat_mixed_dtype", _chunk_cat_case(rng, rng.random() < 0.8), op, {"mode": in_mode},
                 rng, k, lambda a, kw: [*a[0], kw["out"]])
    assert mode.stats.fast_path_calls > CALLS // 2, mode.stats.report()  # the fuzzer reached the fast path
