"""``NpuFastCopyMode`` under ``torch.compile``: frames compile (never skipped), once, with the mode
entered or not, and the mode counts the copies the compiled code makes at run time."""
from __future__ import annotations

import pytest
import torch

import npu_dispatch
from npu_dispatch.lowerings.backend import make_backend
from copy_in_graphs import assert_same_bits, fsdp_copy_in, shards

SIZES = [5, 7, 9]


class Counting:
    """A backend that counts compiles and runs of what it compiled."""

    def __init__(self, inner):
        self.inner, self.compiles, self.runs = inner, 0, 0

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        compiled = self.inner(gm, example_inputs)

        def run(*args):
            self.runs += 1
            return compiled(*args)

        return run


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _case(rank=1, world=2, sizes=SIZES):
    f, _, numel = fsdp_copy_in(sizes, rank, world, torch.bfloat16)
    sh = shards(sizes)
    ref = torch.zeros(world * numel, dtype=torch.bfloat16)
    f(sh, ref)
    return f, sh, ref, lambda: torch.zeros(world * numel, dtype=torch.bfloat16)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_once_inside_and_outside_the_mode_and_counts_compiled_calls(dynamic):
    f, sh, ref, fresh = _case()
    backend = Counting(make_backend("auto"))
    cf = torch.compile(f, backend=backend, dynamic=dynamic)
    mode = npu_dispatch.NpuFastCopyMode()
    outs = []
    for inside in (True, False, True, False):
        out = fresh()
        if inside:
            with mode:
                cf(sh, out)
        else:
            cf(sh, out)
        outs.append(out)
    assert backend.compiles == 1, "entering or leaving the mode recompiled"
    assert backend.runs == 4, "a call ran eagerly instead of the compiled code"
    for out in outs:
        assert_same_bits(out, ref, nan_payload=False)  # Inductor's bf16 cast
    # Each compiled run calls fsdp.all_gather_copy_in once, as Inductor's fallback (the cast is
    # Inductor's own write); the mode saw the two runs made inside it, and nothing else.
    assert mode.stats.as_dict()["ops"]["fsdp.all_gather_copy_in"]["calls"] == 2
    assert mode.stats.fast_path_calls == 2 and mode.stats.total_fallback_calls == 0


def test_dynamic_shapes_under_the_mode_do_not_recompile():
    backend = Counting(make_backend("auto"))
    mode = npu_dispatch.NpuFastCopyMode()

    def f(dsts, srcs):
        torch._foreach_copy_(dsts, srcs)

    cf = torch.compile(f, backend=backend, dynamic=True)
    for n in (6, 11, 23):
        srcs = [torch.randn(n), torch.randn(n + 1)]
        dsts, ref = [torch.zeros(n, dtype=torch.bfloat16), torch.zeros(n + 1, dtype=torch.bfloat16)], None
        ref = [d.clone() for d in dsts]
        torch._foreach_copy_(ref, srcs)
        with mode:
            cf(dsts, srcs)
        for d, r in zip(dsts, ref):
            assert_same_bits(d, r)
    assert backend.compiles == 1 and backend.runs == 3


def test_first_call_inside_the_mode_does_not_leave_the_function_eager():
    f, sh, ref, fresh = _case()
    backend = Counting(make_backend("auto"))
    cf = torch.compile(f, backend=backend)
    with npu_dispatch.NpuFastCopyMode():
        cf(sh, fresh())
    out = fresh()
    cf(sh, out)
    assert backend.compiles == 1 and backend.runs == 2
    assert_same_bits(out, ref, nan_payload=False)  # fused: Inductor's bf16 cast


def test_the_debugging_mode_does_not_stop_a_compile():
    # strict pushes a Python dispatch mode; it declares ignore_compile_internals, so Dynamo still
    # compiles the function inside it, once.
    f, sh, ref, fresh = _case()
    backend = Counting(make_backend("auto"))
    cf = torch.compile(f, backend=backend)
    out = fresh()
    with npu_dispatch.NpuFastCopyMode(strict=True):
        cf(sh, out)
    assert backend.compiles == 1 and backend.runs == 1
    assert_same_bits(out, ref, nan_payload=False)


def test_plain_inductor_fallback_is_counted_by_the_mode():
    f, sh, ref, fresh = _case()
    backend = Counting(torch._inductor.compile_fx.compile_fx)
    cf = torch.compile(f, backend=backend)
    out = fresh()
    with npu_dispatch.NpuFastCopyMode() as mode:
        cf(sh, out)
    assert backend.runs == 1
    # Stock Inductor calls fsdp.all_gather_copy_in as a Python fallback: the mode takes it.
    assert mode.stats.as_dict()["ops"]["fsdp.all_gather_copy_in"]["fast_calls"] == 1
    assert_same_bits(out, ref, nan_payload=False)


@pytest.mark.parametrize("backend", ["npu_dispatch", "inductor"])
def test_fullgraph_with_the_mode_active(backend):
    f, sh, ref, fresh = _case(rank=0)
    out = fresh()
    with npu_dispatch.NpuFastCopyMode():
        torch.compile(f, backend=backend, fullgraph=True)(sh, out)
    assert_same_bits(out, ref, nan_payload=False)
