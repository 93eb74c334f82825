"""``npu_dispatch.lowerings``: registration, the ``auto`` rule, aliasing, the FX graph cache,
long lists and the ``"npu_dispatch"`` backend. Results are compared with the stock ops run eagerly."""
from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor import lowering as L
from torch._inductor.utils import fresh_cache, run_and_get_code

import npu_dispatch.lowerings as ndl
from npu_dispatch.lowerings import strategy
from copy_in_graphs import assert_same_bits, fsdp_copy_in, shards

aten = torch.ops.aten
COPY_IN = torch.ops.fsdp.all_gather_copy_in.default
OPS = [COPY_IN, aten._foreach_copy.default, aten._foreach_copy_.default]
FALLBACK = "torch.ops.fsdp.all_gather_copy_in"
NATIVE = "torch.ops.npu_dispatch.foreach_copy_.default("


@pytest.fixture(autouse=True)
def _clean():
    torch._dynamo.reset()
    yield
    ndl.unregister()
    torch._dynamo.reset()


def _snapshot():
    rule_holder = torch._library.simple_registry.singleton.find("aten::_foreach_copy_").torch_dispatch_rules
    return (
        {op: L.lowerings.get(op) for op in OPS},
        {op: op in L.fallbacks for op in OPS},
        {op: op in L.needs_realized_inputs for op in OPS},
        {op: L._maybe_layout_constraints.get(op) for op in OPS},
        inductor_config.post_grad_custom_post_pass,
        dict(rule_holder._data) if hasattr(rule_holder, "_data") else None,
    )


@pytest.mark.parametrize("implicit_fallback", [False, True])
def test_unregister_restores_the_previous_lowerings_exactly(implicit_fallback):
    if implicit_fallback and COPY_IN not in L.lowerings:
        L.make_fallback(COPY_IN, warn=False)  # what stock Inductor leaves after its first compile
    before = _snapshot()
    ndl.register("fused")
    first = {op: L.lowerings[op] for op in OPS}
    assert all(first[op] is not before[0][op] for op in OPS)
    assert not any(op in L.fallbacks or op in L.needs_realized_inputs for op in OPS)
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    assert FunctionalTensorMode in _snapshot()[5]  # the aliasing rule (functionalize.py)
    ndl.register("fused")  # idempotent
    assert {op: L.lowerings[op] for op in OPS} == first
    ndl.register("native")  # a new strategy replaces the old, lowerings stay ours
    assert ndl.current_strategy() == "native" and {op: L.lowerings[op] for op in OPS} == first
    ndl.unregister()
    assert _snapshot() == before
    assert not ndl.is_registered() and ndl.current_strategy() is None
    ndl.unregister()  # no-op


def test_user_post_grad_pass_is_kept_and_restored():
    class Mine(torch._inductor.custom_graph_pass.CustomGraphPass):
        def __call__(self, graph):
            pass

        def uuid(self):
            return "mine"

    mine = Mine()
    with inductor_config.patch(post_grad_custom_post_pass=mine):
        ndl.register()
        passes = inductor_config.post_grad_custom_post_pass
        assert passes[0] is mine and len(passes) == 2
        ndl.unregister()
        assert inductor_config.post_grad_custom_post_pass is mine


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="unknown strategy 'fast'"):
        ndl.register("fast")
    assert not ndl.is_registered()


def test_auto_rule_per_device_type_and_length(caplog):
    assert strategy.choose("auto", "cpu", 200, "x") == "fused"
    assert strategy.choose("auto", "cuda", 200, "x") == "fused"  # Triton declares FOREACH
    assert strategy.choose("auto", "npu", 200, "x") == "native"  # no Inductor foreach support
    assert strategy.choose("auto", "cpu", ndl.MAX_FUSED_TENSORS + 1, "x") == "native"
    assert strategy.choose("fused", "npu", 10_000, "x") == "fused"  # an explicit request wins
    # The decision is visible in the logs of a compile (TORCH_LOGS="+npu_dispatch").
    ndl.register()
    f, _, numel = fsdp_copy_in([3, 4], 1, 2, torch.bfloat16)
    with fresh_cache(), caplog.at_level(logging.INFO, logger="npu_dispatch.lowerings"):
        torch.compile(f)(shards([3, 4]), torch.zeros(2 * numel, dtype=torch.bfloat16))
    assert "all_gather_copy_in of 2 tensor(s) on cpu -> fused" in caplog.text


def _swap(a):
    torch._foreach_copy_([a[0:4], a[4:8]], [a[4:8], a[0:4]])
    return a


def _shift_and_cast(a, b):
    # src[1] reads what dst[0] writes (a[2:4]); dsts are views of the graph input a.
    torch._foreach_copy_([a[2:6], a[6:10]], [b[0:4], a[0:4]])
    return a * 1


def _into_input_views(a, b):
    torch._foreach_copy_([a[0:4], a[8:12]], [b, b * 2])


@pytest.mark.parametrize("lowering", ["fused", "native"])
@pytest.mark.parametrize("fn,make", [
    (_swap, lambda: (torch.arange(8.0),)),
    (_shift_and_cast, lambda: (torch.arange(12.0), -torch.arange(4.0, dtype=torch.float64))),
    (_into_input_views, lambda: (torch.arange(12.0), torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))),
])
def test_aliasing_matches_eager(lowering, fn, make):
    ndl.register(lowering)
    ref_args, args = make(), make()
    ref = fn(*ref_args)
    got = torch.compile(fn, fullgraph=True)(*args)
    for r, g in zip(ref_args, args):
        assert_same_bits(g, r)
    if ref is not None:
        assert_same_bits(got, ref)


def _copy_in_code(f, sh, numel):
    torch._dynamo.reset()
    counters.clear()
    _, code = run_and_get_code(torch.compile(f), sh, torch.zeros(2 * numel, dtype=torch.bfloat16))
    return code[0]


def test_fx_graph_cache_keeps_graphs_with_and_without_lowerings_apart():
    f, _, numel = fsdp_copy_in([5, 7, 9], 1, 2, torch.bfloat16)
    sh = shards([5, 7, 9])
    with fresh_cache(), inductor_config.patch(fx_graph_cache=True):
        assert FALLBACK in _copy_in_code(f, sh, numel)
        assert FALLBACK in _copy_in_code(f, sh, numel)
        assert counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"] >= 1
        ndl.register("fused")
        assert FALLBACK not in _copy_in_code(f, sh, numel)  # not served the stock entry
        ndl.register("native")
        assert NATIVE in _copy_in_code(f, sh, numel)  # nor the fused one
        ndl.unregister()
        assert FALLBACK in _copy_in_code(f, sh, numel)  # and the stock entry is back


def test_1500_small_tensors_compile_and_match_eager():
    n = 1500
    gen = torch.Generator().manual_seed(3)
    srcs = [torch.randn(1 + i % 7, generator=gen) for i in range(n)]
    ref = [torch.zeros(1 + i % 7, dtype=torch.bfloat16) for i in range(n)]
    dsts = [d.clone() for d in ref]
    torch._foreach_copy_(ref, srcs)

    def f(d, s):
        torch._foreach_copy_(d, s)

    ndl.register()  # auto: more than MAX_FUSED_TENSORS -> one native call
    _, code = run_and_get_code(torch.compile(f), dsts, srcs)
    assert code[0].count(NATIVE) == 1
    for g, r in zip(dsts, ref):
        assert_same_bits(g, r)


def test_backend_by_name_scopes_the_lowerings():
    f, _, numel = fsdp_copy_in([5, 7, 9], 2, 4, torch.bfloat16)
    sh = shards([5, 7, 9])
    ref_out = torch.zeros(4 * numel, dtype=torch.bfloat16)
    f(sh, ref_out)
    out = torch.zeros(4 * numel, dtype=torch.bfloat16)
    _, code = run_and_get_code(torch.compile(f, backend="npu_dispatch"), sh, out)
    assert FALLBACK not in code[0]
    assert_same_bits(out, ref_out, nan_payload=False)
    assert not ndl.is_registered()  # active only while the backend compiled
    torch._dynamo.reset()
    _, code = run_and_get_code(torch.compile(f, backend="inductor"), sh, out)
    assert FALLBACK in code[0]


def _bf16_inputs_into_fp32_output(b):
    flat = torch.empty(5, dtype=torch.bfloat16)
    sp = torch.split(flat, [2, 3])
    torch._foreach_copy_(sp, [b[:2], b[2:]])
    _, out = torch.ops.fsdp.all_gather_copy_in(list(sp), torch.zeros(10), [2, 3], 5, 1)
    return out * 1


@pytest.mark.parametrize("lowering", ["fused", "native", "auto"])
def test_narrow_inputs_keep_their_rounding_in_a_wider_output(lowering):
    # Eager rounds the fp32 values to bf16 when the cast stores them; a fused write into the fp32
    # output must not skip that rounding.
    b = torch.randn(5, generator=torch.Generator().manual_seed(0))
    ref = _bf16_inputs_into_fp32_output(b)
    ndl.register(lowering)
    torch._dynamo.reset()
    got = torch.compile(_bf16_inputs_into_fp32_output, fullgraph=True)(b)
    assert_same_bits(got, ref)


def _into_inputs(a, b, x, y):
    torch._foreach_copy_([a, b], [x, y])
    return a.sum()


@pytest.mark.parametrize("lowering", ["fused", "native"])
def test_graph_input_destinations_move_their_versions_as_eager(lowering):
    # AOTAutograd bumps mutated graph inputs itself; the native kernel must not add its own bump.
    ndl.register(lowering)
    ref = [torch.zeros(8), torch.zeros(8), torch.ones(8), torch.full((8,), 2.0)]
    got = [t.clone() for t in ref]
    _into_inputs(*ref)
    torch.compile(_into_inputs, fullgraph=True)(*got)
    assert [t._version for t in got[:2]] == [t._version for t in ref[:2]] == [1, 1]
    assert all(torch.equal(g, r) for g, r in zip(got, ref))
