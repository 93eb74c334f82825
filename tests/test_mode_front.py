"""``NpuFastCopyMode(front=True)``: Python calls of ``torch._foreach_copy_`` that the fast lane
takes are copied before dispatch; everything else reaches the dispatch mode as without the front.
Every case is compared with stock (bits, versions, errors, return value) and checks which way the
call went (the lane's counter; the stats the mode keeps either way)."""
from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwad
from torch.overrides import TorchFunctionMode
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import TorchDispatchMode

import npu_dispatch as nd
from npu_dispatch import _native
from cases import bits, lane_calls, route_calls

if not _native.available():
    pytest.skip(f"native library not built: {_native.status()[1]}", allow_module_level=True)


def plain_lists():
    g = torch.Generator().manual_seed(3)
    srcs = [torch.randn(n, generator=g) for n in (5, 64, 300)]
    srcs[0][1] = float("nan")
    return [torch.zeros(n, dtype=torch.bfloat16) for n in (5, 64, 300)], srcs


def same_as_stock(make, under):
    d0, s0 = make()
    r0 = torch._foreach_copy_(d0, s0)
    d1, s1 = make()
    with under:
        r1 = torch._foreach_copy_(d1, s1)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(d0, d1))
    assert [t._version for t in d1] == [t._version for t in d0]
    assert (r0 is d0) == (r1 is d1)


def test_a_plain_list_is_copied_before_dispatch_and_counted_by_the_mode(dispatched):
    mode = nd.NpuFastCopyMode(front=True)
    before = lane_calls()
    same_as_stock(plain_lists, mode)
    assert lane_calls() == before + 1 and dispatched == []
    s = mode.stats.as_dict()
    assert s["ops"]["aten._foreach_copy_"]["calls"] == 1 and s["ops"]["aten._foreach_copy_"]["fast_calls"] == 1
    assert s["paths"]["foreach"]["tensors"] == 3


def test_with_an_outer_dispatch_mode_the_front_steps_aside(dispatched):
    class Outer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    d0, s0 = plain_lists()
    torch._foreach_copy_(d0, s0)
    d1, s1 = plain_lists()
    with Outer(), nd.NpuFastCopyMode(front=True):
        torch._foreach_copy_(d1, s1)
    assert dispatched == [1]  # as without the front
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(d0, d1))


def test_an_inner_dispatch_mode_still_sees_the_op():
    seen = []

    class Inner(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with nd.NpuFastCopyMode(front=True), Inner():
        torch._foreach_copy_(*plain_lists())
    assert "aten._foreach_copy_.default" in seen


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_another_torch_function_mode_still_sees_the_call(where):
    seen = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    mode = nd.NpuFastCopyMode(front=True)
    if where == "inside":
        with mode, Watch():
            same_as_stock(plain_lists, torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x))
    else:
        with Watch(), mode:
            torch._foreach_copy_(*plain_lists())
    assert "_foreach_copy_" in seen


@pytest.mark.parametrize("case", ["requires_grad", "strided", "subclass", "forward_ad", "verify", "profiler"])
def test_calls_the_lane_does_not_take_reach_the_dispatch_mode_and_match_stock(case, dispatched):
    def make():
        d, s = plain_lists()
        if case == "requires_grad":
            s = [t.requires_grad_() for t in s]
        elif case == "strided":
            d = [torch.zeros(2 * t.numel(), dtype=torch.bfloat16)[::2] for t in s]
        elif case == "subclass":
            d = [TwoTensor(t, t.clone()) for t in d]
        return d, s

    mode = nd.NpuFastCopyMode(front=True, verify=case == "verify")
    routed = route_calls()
    if case == "forward_ad":
        with fwad.dual_level():
            same_as_stock(make, mode)
    elif case == "profiler":
        with torch.profiler.profile() as prof:
            same_as_stock(make, mode)
        assert "aten::_foreach_copy_" in {e.name for e in prof.events()}  # as the profiler records stock
        # Past the front, the op is in the dispatcher (and the profiler's record): the mode's
        # native route copies it there.
        assert route_calls() == routed + 1 and not dispatched
        return
    else:
        same_as_stock(make, mode)
    assert len(dispatched) >= 1  # the dispatch handler saw it (a subclass: its unwrapped copies)
    assert route_calls() == routed


def test_errors_are_stocks():
    def outcome(under):
        d, s = [torch.zeros(3), torch.zeros(2)], [torch.ones(3), torch.ones(5)]
        try:
            with under:
                torch._foreach_copy_(d, s)
        except RuntimeError as e:
            return str(e), [t._version for t in d], [bits(t) for t in d]
        return None

    want, got = outcome(torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x)), outcome(
        nd.NpuFastCopyMode(front=True))
    assert want[0] == got[0] and want[1] == got[1]
    assert all(torch.equal(a, b) for a, b in zip(want[2], got[2]))


def test_compiled_code_under_the_front_matches_compiled_stock():
    def f(d, s):
        torch._foreach_copy_(d, s)

    # Against the same compiled function without a mode: stock Inductor's own lowering of this
    # copy rounds a NaN to bf16 differently from eager stock, mode or not.
    torch._dynamo.reset()
    d0, s0 = plain_lists()
    torch.compile(f, fullgraph=True)(d0, s0)
    torch._dynamo.reset()
    d1, s1 = plain_lists()
    with nd.NpuFastCopyMode(front=True):
        torch.compile(f, fullgraph=True)(d1, s1)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(d0, d1))


def test_re_entering_the_same_mode_keeps_one_front_per_level():
    mode = nd.NpuFastCopyMode(front=True)
    with mode:
        with mode:
            torch._foreach_copy_(*plain_lists())
        torch._foreach_copy_(*plain_lists())
    assert torch._C._len_torch_function_stack() == 0
    assert mode.stats.as_dict()["ops"]["aten._foreach_copy_"]["calls"] == 2


def test_a_compiled_function_compiles_once_per_mode_state_and_no_more():
    # The documented cost of the front: Dynamo guards on the torch-function mode stack.
    from torch._dynamo.testing import CompileCounter

    def f(d, s):
        torch._foreach_copy_(d, s)

    torch._dynamo.reset()
    counter = CompileCounter()
    cf = torch.compile(f, backend=counter)
    mode = nd.NpuFastCopyMode(front=True)
    for inside in (True, False, True, False):
        d, s = plain_lists()
        if inside:
            with mode:
                cf(d, s)
        else:
            cf(d, s)
    assert counter.frame_count == 2


def test_torch_split_tuples_take_the_front_as_fsdp2_passes_them(dispatched):
    # FSDP2's copy-in: torch._foreach_copy_(torch.split(...), inputs), a tuple of views.
    def make():
        g = torch.Generator().manual_seed(5)
        return torch.zeros(40, dtype=torch.bfloat16).split([7, 0, 33]), tuple(
            torch.randn(n, generator=g) for n in (7, 0, 33))

    before = lane_calls()
    same_as_stock(make, nd.NpuFastCopyMode(front=True))
    assert lane_calls() == before + 1 and dispatched == []


def test_with_torch_dispatch_disabled_the_front_counts_nothing_as_the_mode():
    mode = nd.NpuFastCopyMode(front=True)
    d0, s0 = plain_lists()
    torch._foreach_copy_(d0, s0)
    d1, s1 = plain_lists()
    with mode, torch._C._DisableTorchDispatch():
        torch._foreach_copy_(d1, s1)
    assert mode.stats.as_dict()["ops"] == {}
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(d0, d1))


def test_exiting_out_of_order_raises_instead_of_popping_the_other_mode():
    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    mode, watch = nd.NpuFastCopyMode(front=True), Watch()
    mode.__enter__()
    watch.__enter__()
    with pytest.raises(RuntimeError, match="reverse order"):
        mode.__exit__(None, None, None)
    watch.__exit__(None, None, None)
    mode.__exit__(None, None, None)  # nothing was changed by the refused exit: now in order
    assert torch._C._len_torch_function_stack() == 0 and torch._C._len_torch_dispatch_stack() == 0
