"""``npu_dispatch.lowerings``: the bucket copies of compile-first FSDP, compiled stock and lowered.

The graphs are what Inductor's collective bucketing emits (``npu_dispatch.testing.bucket_graphs``),
compiled post-grad; every lowered result is compared with the same graph run eagerly, on seeded
random shapes and values that stress casts (NaN, +-inf, -0.0, subnormals, bf16 rounding ties).
Registration, the ``auto`` rule, declines and the FX graph cache are checked here too; the real
2-rank training lives in ``test_compiled_fsdp.py``."""
from __future__ import annotations

import logging
import random
import re

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor import lowering as L
from torch._inductor.utils import fresh_cache

import torch._inductor.fx_passes.bucketing  # noqa: F401  defines bucketing::

import npu_dispatch.lowerings as ndl
from npu_dispatch.lowerings import strategy
from npu_dispatch.lowerings.bucket_copy_in import match_cat_copy
from npu_dispatch.lowerings.register import CacheKey
from npu_dispatch.testing.bucket_graphs import (
    compile_post_grad, copy_in_custom_ops, copy_in_default, rs_custom_ops, rs_default,
)
from copy_in_graphs import assert_same_bits

aten = torch.ops.aten
AG = torch.ops.bucketing._pre_bucket_all_gather.default
RS = torch.ops.bucketing._pre_bucket_reduce_scatter.default
OPS = [aten.cat.default, AG, RS]
SPECIAL = [float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, -1e-45, 1.00390625, 1.01171875, 3.0e38, 65520.0]


@pytest.fixture(autouse=True)
def _clean():
    ndl.unregister()
    torch._dynamo.reset()
    yield
    ndl.unregister()
    torch._dynamo.reset()


def _values(shape, dtype, gen):
    """Random values of ``shape`` with the special values spread in, cast to ``dtype``."""
    n = 1
    for d in shape:
        n *= d
    x = torch.randn(n, generator=gen) * 10.0 ** torch.randint(-8, 8, (n,), generator=gen)
    if n:
        idx = torch.randint(0, n, (min(n, len(SPECIAL)),), generator=gen)
        x[idx] = torch.tensor(SPECIAL[: idx.numel()])
    return x.reshape(shape).to(dtype)


def _shapes(rng: random.Random, count: int, world: int):
    """Shard shapes: 1-D and 2-D, odd sizes, an empty one now and then."""
    out = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.1:
            out.append((0,))
        elif kind < 0.55:
            out.append((rng.randint(1, 40),))
        else:
            out.append((rng.randint(1, 9), rng.randint(1, 17)))
    return out


def _allocs(code: str) -> list[str]:
    """The dtypes of the buffers the generated ``call`` allocates, in order."""
    body = code[code.index("def call(self, args)"):]
    return re.findall(r"empty_strided_cpu\([^\n]*?(torch\.\w+)\)", body[: body.index("\n\n\n")])


def _bucket(out, n, world, rank):
    return out.narrow(0, n * rank, n)


# --- the all-gather copy-in -----------------------------------------------------------------------

@pytest.mark.parametrize("strategy_name", ["fused", "native"])
@pytest.mark.parametrize("pattern", ["default", "custom_ops"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bucket_copy_in_matches_eager_on_random_shards(strategy_name, pattern, seed):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    world = rng.choice([2, 3, 8])
    rank = rng.randrange(world)
    out_dtype = rng.choice([torch.bfloat16, torch.float16, torch.float32])
    shapes = _shapes(rng, rng.randint(1, 24), world)
    shards = [_values(s, torch.float32, gen) for s in shapes]
    graph = copy_in_default(world, rank, out_dtype) if pattern == "default" else copy_in_custom_ops(world, rank, out_dtype)
    n = sum(s.numel() for s in shards)
    want = _bucket(graph(*shards)[0], n, world, rank)
    for _ in range(3):  # several calls of one compiled graph: no state carried between them
        run, code = compile_post_grad(graph, shards, strategy_name) if _ == 0 else (run, code)
        got = _bucket(run(*shards)[0], n, world, rank)
        # native runs ATen's cast (every bit); fused runs Inductor's, whose NaN payload may differ.
        assert_same_bits(got, want, nan_payload=strategy_name == "native")
    assert "torch.ops.bucketing" not in code, "the bucketing op stayed a Python fallback"
    if strategy_name == "fused" and n:
        assert _allocs(code) == [str(out_dtype)], "not lowered: the stock copy-in allocates a temporary"
    if strategy_name == "native" and n:
        assert code.count("torch.ops.npu_dispatch.foreach_copy_.default(") == 1
    else:
        assert "npu_dispatch" not in code


def test_default_copy_in_writes_the_bucket_without_a_temporary():
    gen = torch.Generator().manual_seed(5)
    shards = [_values((k + 3, 7), torch.float32, gen) for k in range(12)]
    _, stock = compile_post_grad(copy_in_default(2, 1), shards, None)
    _, lowered = compile_post_grad(copy_in_default(2, 1), shards, "fused")
    # Stock: a bucket-sized fp32 temporary (the cat) next to the bf16 bucket; lowered: the bucket.
    assert _allocs(stock) == ["torch.float32", "torch.bfloat16"] or _allocs(stock) == ["torch.bfloat16", "torch.float32"]
    assert _allocs(lowered) == ["torch.bfloat16"]


def test_custom_ops_copy_in_lowers_to_the_default_modes_code():
    gen = torch.Generator().manual_seed(6)
    shards = [_values((k + 2,), torch.float32, gen) for k in range(9)]
    _, stock = compile_post_grad(copy_in_custom_ops(4, 3), shards, None)
    _, a = compile_post_grad(copy_in_custom_ops(4, 3), shards, "fused")
    _, b = compile_post_grad(copy_in_default(4, 3), shards, "fused")
    assert "torch.ops.bucketing._pre_bucket_all_gather.default(" in stock
    assert a == b


def test_mixed_input_dtypes_cast_through_cats_promotion():
    # cat promotes bf16 and fp32 shards to fp32, then copy_ casts into fp16: the lowering must
    # cast in the same two steps (bf16 -> fp16 directly would round differently).
    gen = torch.Generator().manual_seed(7)
    shards = [_values((33,), torch.bfloat16, gen), _values((17,), torch.float32, gen), _values((5, 3), torch.bfloat16, gen)]
    graph = copy_in_default(2, 0, torch.float16)
    n = sum(s.numel() for s in shards)
    want = _bucket(graph(*shards)[0], n, 2, 0)
    for s in ("fused", "native"):
        run, _ = compile_post_grad(graph, shards, s)
        assert_same_bits(_bucket(run(*shards)[0], n, 2, 0), want, nan_payload=False)


def test_bit_viewed_inputs_keep_the_stock_op():
    # custom_ops_multidtype: an fp32 shard bit-viewed into a bf16 bucket is not a cast: stock's.
    gen = torch.Generator().manual_seed(8)
    shards = [_values((6,), torch.float32, gen), _values((4,), torch.bfloat16, gen)]
    graph = copy_in_custom_ops(2, 1, torch.bfloat16, out_dtypes=[torch.float32, torch.bfloat16])
    want = graph(*shards)[0]
    run, code = compile_post_grad(graph, shards, "fused")
    assert "torch.ops.bucketing._pre_bucket_all_gather.default(" in code
    assert_same_bits(run(*shards)[0][16:], want[16:])  # rank 1 of 2: 12 + 4 bf16 elements


# --- the reduce-scatter copy-in -------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("strategy_name", ["fused", "native"])
def test_reduce_scatter_copy_in_matches_eager_on_random_gradients(seed, strategy_name):
    rng, gen = random.Random(100 + seed), torch.Generator().manual_seed(100 + seed)
    world = rng.choice([2, 4])
    shapes = [(s[0] * world, *s[1:]) for s in _shapes(rng, rng.randint(1, 20), world)]
    grads = [_values(s, torch.bfloat16, gen) for s in shapes]
    want = rs_default(world)(*grads)[0]
    run, code = compile_post_grad(rs_custom_ops(world), grads, strategy_name)
    for _ in range(2):
        assert_same_bits(run(*grads)[0], want)  # a widening cast: every bit, NaN payloads too
    assert "torch.ops.bucketing" not in code


def test_reduce_scatter_copy_in_is_stock_inductors_fused_cat():
    gen = torch.Generator().manual_seed(9)
    grads = [_values((2 * (k + 1), 5), torch.bfloat16, gen) for k in range(7)]
    _, stock_default = compile_post_grad(rs_default(2), grads, None)
    _, stock_custom = compile_post_grad(rs_custom_ops(2), grads, None)
    _, lowered = compile_post_grad(rs_custom_ops(2), grads, "fused")
    assert "torch.ops.bucketing._pre_bucket_reduce_scatter.default(" in stock_custom
    assert lowered == stock_default


# --- declines -------------------------------------------------------------------------------------

def _graph(build):
    g = torch.fx.Graph()
    build(g)
    return g


def _meta(node, t):
    node.meta["val"] = t
    return node


def test_match_takes_only_the_bucket_copy_in():
    def build(reader_between=False, second_user=False, two_d=False):
        g = torch.fx.Graph()
        a = _meta(g.placeholder("a"), torch.empty(4))
        b = _meta(g.placeholder("b"), torch.empty(3, 2) if two_d else torch.empty(6))
        out = _meta(g.call_function(aten.empty.memory_format, ([20],), {"dtype": torch.bfloat16}), torch.empty(20, dtype=torch.bfloat16))
        dst = _meta(g.call_function(aten.slice.Tensor, (out, 0, 10, 20)), torch.empty(10, dtype=torch.bfloat16))
        cat = _meta(g.call_function(aten.cat.default, ([a, b],)), torch.empty(10) if not two_d else torch.empty(0))
        if reader_between:
            _meta(g.call_function(aten.sum.default, (out,)), torch.empty(()))
        cp = _meta(g.call_function(aten.copy_.default, (dst, cat)), torch.empty(10, dtype=torch.bfloat16))
        if second_user:
            _meta(g.call_function(aten.neg.default, (cat,)), torch.empty(10))
        g.output((out, cp))
        return g, cat, cp, dst

    g, cat, cp, dst = build()
    assert match_cat_copy(cat) == (cp, dst)
    for kw in ({"reader_between": True}, {"second_user": True}, {"two_d": True}):
        g, cat, cp, dst = build(**kw)
        assert match_cat_copy(cat) is None, kw


def test_every_other_cat_is_stock():
    gen = torch.Generator().manual_seed(10)
    xs = [_values((5, 4), torch.float32, gen), _values((2, 4), torch.float32, gen)]

    def f(a, b):
        c = torch.cat([a, b])
        return (c * 2, torch.cat([a.reshape(-1), b.reshape(-1)]))

    _, stock = compile_post_grad(f, xs, None)
    run, lowered = compile_post_grad(f, xs, "fused")
    assert lowered == stock
    for got, want in zip(run(*xs), f(*xs)):
        assert_same_bits(got, want)


# --- registration ---------------------------------------------------------------------------------

def _snapshot():
    return (
        {op: L.lowerings.get(op) for op in OPS},
        {op: op in L.fallbacks for op in OPS},
        {op: op in L.needs_realized_inputs for op in OPS},
        {op: L._maybe_layout_constraints.get(op) for op in OPS},
        inductor_config.post_grad_custom_pre_pass,
        inductor_config.post_grad_custom_post_pass,
    )


@pytest.mark.parametrize("implicit_fallback", [False, True])
def test_unregister_restores_the_previous_lowerings_exactly(implicit_fallback):
    if implicit_fallback and AG not in L.lowerings:
        L.make_fallback(AG, warn=False)  # what stock Inductor leaves after its first compile
    before = _snapshot()
    ndl.register("fused")
    first = {op: L.lowerings[op] for op in OPS}
    assert all(first[op] is not before[0][op] for op in OPS)
    assert not any(op in L.fallbacks or op in L.needs_realized_inputs for op in OPS)
    assert isinstance(inductor_config.post_grad_custom_pre_pass, CacheKey)
    ndl.register("fused")  # idempotent
    assert {op: L.lowerings[op] for op in OPS} == first
    ndl.register("native")  # a new strategy replaces the old, lowerings stay ours
    assert ndl.current_strategy() == "native" and {op: L.lowerings[op] for op in OPS} == first
    assert inductor_config.post_grad_custom_pre_pass.uuid()[1] == "native"
    ndl.unregister()
    assert _snapshot() == before
    assert not ndl.is_registered() and ndl.current_strategy() is None
    ndl.unregister()  # no-op


def test_user_pre_pass_is_kept_and_restored():
    class Mine(torch._inductor.custom_graph_pass.CustomGraphPass):
        def __call__(self, graph):
            pass

        def uuid(self):
            return "mine"

    mine = Mine()
    with inductor_config.patch(post_grad_custom_pre_pass=mine):
        ndl.register()
        passes = inductor_config.post_grad_custom_pre_pass
        assert passes[0] is mine and isinstance(passes[1], CacheKey) and len(passes) == 2
        ndl.unregister()
        assert inductor_config.post_grad_custom_pre_pass is mine
        # A pass set after register() survives a strategy change and unregister().
        ndl.register()
        inductor_config.post_grad_custom_pre_pass = [mine, *([] if isinstance(inductor_config.post_grad_custom_pre_pass, CacheKey) else [])]
        with ndl.active("native"):
            assert inductor_config.post_grad_custom_pre_pass[0] is mine
        ndl.unregister()
        assert inductor_config.post_grad_custom_pre_pass is mine


def test_lowerings_hold_when_a_backend_assigns_the_post_pass_outright():
    # torchtitan's SimpleFSDP backend sets post_grad_custom_post_pass to its own function.
    seen = []
    gen = torch.Generator().manual_seed(11)
    shards = [_values((k + 4,), torch.float32, gen) for k in range(5)]
    ndl.register()
    with inductor_config.patch(post_grad_custom_post_pass=lambda graph: seen.append(len(graph.nodes))):
        run, code = compile_post_grad(copy_in_default(2, 1), shards, "auto")
    assert seen, "the user's post pass did not run"
    assert _allocs(code) == ["torch.bfloat16"]  # lowered: no fp32 temporary


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="unknown strategy 'fast'"):
        ndl.register("fast")
    assert not ndl.is_registered()


def test_auto_rule_per_device_type_and_length(caplog):
    assert strategy.choose("auto", "cpu", 200, "x") == "fused"
    assert strategy.choose("auto", "cuda", 200, "x") == "fused"  # Triton declares FOREACH
    assert strategy.choose("auto", "npu", 200, "x") == "native"  # no Inductor foreach support here
    assert strategy.choose("auto", "cpu", ndl.MAX_FUSED_TENSORS + 1, "x") == "native"
    assert strategy.choose("fused", "npu", 10_000, "x") == "fused"  # an explicit request wins
    gen = torch.Generator().manual_seed(12)
    shards = [_values((3,), torch.float32, gen), _values((4,), torch.float32, gen)]
    with caplog.at_level(logging.INFO, logger="npu_dispatch.lowerings"):
        compile_post_grad(copy_in_default(2, 1), shards, "auto")
    assert "bucket copy-in (cat + copy_) of 2 tensor(s) on cpu -> fused" in caplog.text


def test_fx_graph_cache_keeps_graphs_with_and_without_lowerings_apart():
    def f(a, b):
        return torch.cat([a, b]) * 2

    xs = (torch.randn(3), torch.randn(4))

    def compile_once():
        torch._dynamo.reset()
        counters.clear()
        torch.compile(f)(*xs)
        return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]

    with fresh_cache(), inductor_config.patch(fx_graph_cache=True):
        assert compile_once() == (0, 1)
        assert compile_once() == (1, 0)
        ndl.register("fused")
        assert compile_once() == (0, 1)  # not served the stock entry
        ndl.register("native")
        assert compile_once() == (0, 1)  # nor the fused one
        ndl.unregister()
        assert compile_once() == (1, 0)  # and the stock entry is back


def test_backend_by_name_scopes_the_lowerings():
    def f(a, b):
        return torch.cat([a, b]) + 1

    out = torch.compile(f, backend="npu_dispatch")(torch.ones(2), torch.zeros(3))
    assert torch.equal(out, torch.tensor([2.0, 2.0, 1.0, 1.0, 1.0]))
    assert not ndl.is_registered()  # active only while the backend compiled
