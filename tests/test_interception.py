"""NpuFastCopyMode's interception (csrc/dispatch/intercept.h, csrc/dispatch/mode_scope.h): which calls its C++
kernels at the BackendSelect key serve, that every outcome either way is stock's (bits, versions,
errors, return value, autograd state, warnings), that they are counted in the right mode's stats,
and that nothing else on the dispatch path changes: no Python dispatch mode is pushed, and no op
the library does not own gets a kernel."""
from __future__ import annotations

import os
import threading
import warnings
from typing import List

import pytest
import torch
import torch.autograd.forward_ad as fwad
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import TorchDispatchMode

import npu_dispatch as nd
from npu_dispatch import _native
from cases import PYTHON_PATH, bits, interception_only

if not _native.available():
    if os.environ.get("NPU_DISPATCH_REQUIRE_NATIVE") == "1":
        pytest.fail(f"native library required: {_native.status()[1]}", pytrace=False)
    pytest.skip(f"native library not built: {_native.status()[1]}", allow_module_level=True)

f32, bf16 = torch.float32, torch.bfloat16


def served(mode) -> int:
    """Calls of aten._foreach_copy_ the mode's kernels served (counted in its stats)."""
    return mode.stats.op_calls["aten._foreach_copy_"]


def _randn(n, seed=0):
    src = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    src[0] = float("nan")
    src[-1] = -0.0
    return src


def singles():
    return [torch.zeros(n, dtype=bf16) for n in (5, 64, 300)], [_randn(n) for n in (5, 64, 300)]


def adjacent():
    # FSDP's copy-in under mixed precision: views of one buffer on both sides (one flat copy).
    sizes = [7, 64, 1, 300]
    return list(torch.zeros(sum(sizes)).split(sizes)), list(_randn(sum(sizes)).split(sizes))


def tuples():
    d, s = adjacent()
    return tuple(d), tuple(s)


def many():
    # 512 pairs: the direct entry would thread their checks; dispatched calls keep one thread.
    sizes = [64 + (i * 37) % 193 for i in range(512)]
    return [torch.zeros(n) for n in sizes], [_randn(n, i) for i, n in enumerate(sizes)]


def large():
    # Above the one-pass plan's 2 MB threshold: checked, then copied in a second step.
    return [torch.zeros(1 << 20), torch.zeros(3, dtype=bf16)], [_randn(1 << 20), _randn(3)]


def serial_copy():
    # 720 KB read plus written: above the direct entry's split (256 KB), under dispatched calls'
    # (768 KB), so the call copies on the calling thread; fp16 -> fp32 above ATen's GRAIN_SIZE
    # (FBGEMM's chunked conversion) with NaN payloads of both signs.
    h = _randn(100_000).to(torch.float16)
    h.view(torch.int16)[1:4] = torch.tensor([0x7C01, 0x7E55, -0x0201], dtype=torch.int16)
    return [torch.zeros(100_000), torch.zeros(20_000, dtype=bf16)], [h, _randn(20_000, 1)]


def split_copy():
    # 1.6 MB read plus written, 800 KB of it destinations: above dispatched calls' split, under the
    # 2 MB second step, so the call copies it in one step split across threads.
    return [torch.zeros(200_000)], [_randn(200_000)]


def with_empty():
    return [torch.zeros(4), torch.zeros(0), torch.zeros(2, 3)], [_randn(4), torch.ones(0), _randn(6).view(2, 3)]


def _version(t):
    return None if t.is_inference() else t._version  # inference tensors keep no counter


def _grad_fn(t):
    try:
        return type(t.grad_fn).__name__
    except RuntimeError as e:  # a multi-output view written in place: stock's error, on reading
        return str(e)


def outcome(make, context=None):
    """What one call leaves observable: destination bits, version moves, whether it returned its
    ``self``, each destination's autograd state (requires_grad, the grad_fn's type), and the
    warnings it issued."""
    d, s = make()
    before = [_version(t) for t in d]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if context is None:
            r = torch._foreach_copy_(d, s)
        else:
            with context:
                r = torch._foreach_copy_(d, s)
    moved = [None if v is None else _version(t) - v for t, v in zip(d, before)]
    grads = [(t.requires_grad, _grad_fn(t)) for t in d]
    return [bits(t) for t in d], moved, r is d, grads, [str(w.message) for w in caught]


def assert_same(a, b):
    assert len(a[0]) == len(b[0]) and all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
    assert a[1:] == b[1:]


@pytest.mark.parametrize("make", [singles, adjacent, tuples, many, serial_copy, split_copy, large, with_empty],
                         ids=lambda f: f.__name__)
def test_plain_lists_are_served_and_match_stock(make):
    mode = nd.NpuFastCopyMode()
    ours = outcome(make, mode)
    assert_same(outcome(make), ours)
    d, s = make()
    stats = mode.stats.as_dict()
    assert stats["ops"]["aten._foreach_copy_"]["calls"] == 1
    assert stats["ops"]["aten._foreach_copy_"]["fast_calls"] == (1 if any(t.numel() for t in d) else 0)
    assert sum(p["tensors"] for p in stats["paths"].values()) == len(d)
    assert stats["paths"]["coalesced"]["calls"] == (1 if make in (adjacent, tuples) else 0)
    assert sum(p["bytes"] for p in stats["paths"].values()) == sum(t.numel() * t.element_size() for t in d)


@interception_only
def test_no_python_dispatch_mode_is_pushed_and_no_other_op_gets_a_kernel():
    with nd.NpuFastCopyMode():
        assert torch._C._len_torch_dispatch_stack() == 0
        assert not torch._C._is_torch_function_mode_enabled()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    owned = ["aten::_foreach_copy_", "aten::_foreach_copy", "aten::split_with_sizes_copy.out",
             "fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat"]
    assert all(has(op, "BackendSelect") for op in owned)
    # Ops the mode does not own keep their dispatch tables: none of these has a BackendSelect
    # kernel, so the key falls through for them as with no mode.
    for op in ["aten::add.Tensor", "aten::copy_", "aten::_foreach_add_.List", "aten::split_with_sizes",
               "aten::narrow", "aten::split_with_sizes_copy", "aten::_chunk_cat.out", "aten::cat.out"]:
        assert not has(op, "BackendSelect"), op


def _grad_leaves():
    d, s = singles()
    return [t.float().requires_grad_() for t in d], s


def _grad_views():
    base = torch.zeros(400, requires_grad=True)
    return list(base[:369].split([5, 64, 300])), [_randn(n) for n in (5, 64, 300)]


def _parameters():
    return [torch.nn.Parameter(torch.zeros(n)) for n in (5, 64, 300)], [_randn(n) for n in (5, 64, 300)]


def _grad_sources():
    d, s = singles()
    return d, [t.requires_grad_() for t in s]


def _below_ad_inplace_or_view():
    return torch._C._AutoDispatchBelowADInplaceOrView()


@pytest.mark.parametrize("case", ["no_grad_leaves", "no_grad_views", "no_grad_parameters", "no_grad_sources",
                                  "inference_mode", "below_ad_inplace_or_view", "autocast"])
def test_plain_lists_in_other_autograd_states_are_served_and_match_stock(case):
    # What FSDP2 does: copies into parameters' storage under no_grad. Below ADInplaceOrView stock's
    # copy_ loop bumps no version counter, and the kernels bump none there either. The tensors are
    # made outside the context (inference_mode would make inference tensors).
    make = {"no_grad_leaves": _grad_leaves, "no_grad_views": _grad_views, "no_grad_parameters": _parameters,
            "no_grad_sources": _grad_sources}.get(case, singles)
    context = {"inference_mode": torch.inference_mode, "below_ad_inplace_or_view": _below_ad_inplace_or_view,
               "autocast": lambda: torch.autocast("cpu", dtype=bf16)}.get(case, torch.no_grad)
    args = [make(), make()]
    it = iter(args)
    mode = nd.NpuFastCopyMode()
    with context():
        stock = outcome(lambda: next(it))
        ours = outcome(lambda: next(it), mode)
    assert served(mode) == 1
    assert_same(stock, ours)
    if case == "below_ad_inplace_or_view":
        assert ours[1] == [0, 0, 0]


def test_stats_are_current_inside_the_block_and_after_it():
    mode = nd.NpuFastCopyMode()
    stats = mode.stats
    with mode:
        for k in range(1, 4):
            torch._foreach_copy_(*singles())
            assert stats.op_calls["aten._foreach_copy_"] == k
            assert stats.tensors["foreach"] == 3 * k
        stats.reset()
        torch._foreach_copy_(*singles())
    assert stats.op_calls["aten._foreach_copy_"] == 1 and stats.fast_path_calls == 1
    assert "aten._foreach_copy_" in stats.report()


@pytest.mark.parametrize("case", ["requires_grad", "strided", "subclass", "forward_ad", "verify", "inference_mode",
                                  "strided_below_ad_inplace_or_view", "zero_dim_cast", "overlap", "broadcast",
                                  "disabled_torch_dispatch", "python_dispatcher"])
def test_every_other_kind_of_call_matches_stock(case):
    def make():
        d, s = singles()
        if case == "requires_grad":
            s = [t.requires_grad_() for t in s]
        elif case in ("strided", "strided_below_ad_inplace_or_view"):
            d = [torch.zeros(2 * t.numel(), dtype=bf16)[::2] for t in s]
        elif case == "subclass":
            d = [TwoTensor(t, t.clone()) for t in d]
        elif case == "zero_dim_cast":
            d, s = [torch.zeros((), dtype=bf16)] + d, [torch.tensor(1.5)] + s
        elif case == "overlap":
            buf = torch.zeros(8)
            d, s = [buf[:5], buf[3:]], [_randn(5), _randn(5, 1)]
        elif case == "broadcast":
            s = [torch.tensor([1.25])] + s[1:]
        return d, s

    from torch._dispatch.python import enable_python_dispatcher

    # inference_mode here: the tensors are made inside it (inference tensors).
    contexts = {"forward_ad": fwad.dual_level, "inference_mode": torch.inference_mode,
                "strided_below_ad_inplace_or_view": _below_ad_inplace_or_view,
                "disabled_torch_dispatch": torch._C._DisableTorchDispatch,
                "python_dispatcher": enable_python_dispatcher}
    outer = contexts.get(case)
    mode = nd.NpuFastCopyMode(verify=case == "verify")
    if outer is None:
        stock, ours = outcome(make), outcome(make, mode)
    else:
        with outer():
            stock, ours = outcome(make), outcome(make, mode)
    assert_same(stock, ours)
    # Every call reaches the planner (a subclass: its unwrapped copies), which counts it; a Python
    # dispatch mode is never called with torch dispatch disabled.
    assert served(mode) >= (0 if PYTHON_PATH and case == "disabled_torch_dispatch" else 1)


@pytest.mark.parametrize("make", [
    lambda: ([torch.zeros(3)], [torch.ones(3), torch.ones(3)]),
    lambda: ([], []),
    lambda: ([torch.zeros(3)], [torch.ones(4)]),
], ids=["lengths", "empty", "shapes"])
def test_errors_are_stocks(make):
    errors = []
    for context in (None, nd.NpuFastCopyMode()):
        with pytest.raises(RuntimeError) as info:
            outcome(make, context)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_another_dispatch_mode_on_the_stack_still_sees_the_call(where):
    seen = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    mode = nd.NpuFastCopyMode()
    # Stock under the same user mode: its handler runs below ADInplaceOrView, where stock's
    # copy_ loop bumps no version counter.
    with Watch():
        stock = outcome(singles)
    if where == "inside":
        with mode, Watch():
            ours = outcome(singles)
    else:
        with Watch(), mode:
            ours = outcome(singles)
    # The Python key comes before BackendSelect: the user's mode sees the op, then the kernels
    # serve it.
    assert torch.ops.aten._foreach_copy_.default in seen
    assert served(mode) == 1
    assert_same(stock, ours)


def test_the_profiler_records_the_op_and_the_planners_ranges():
    mode = nd.NpuFastCopyMode()
    with torch.profiler.profile() as prof:
        ours = outcome(singles, mode)
    names = {e.name for e in prof.events()}
    assert {"aten::_foreach_copy_", "npu_dispatch::foreach", "npu_dispatch::cpu_kernel"} <= names
    assert served(mode) == 1
    assert_same(outcome(singles), ours)


def test_a_profiler_started_inside_the_block_keeps_working():
    mode = nd.NpuFastCopyMode()
    with mode:
        with torch.profiler.profile() as prof:
            torch._foreach_copy_(*singles())
        torch._foreach_copy_(*singles())
    assert "aten::_foreach_copy_" in {e.name for e in prof.events()}
    assert served(mode) == 2


def test_a_profiler_started_in_the_block_and_stopped_after_it_keeps_its_events():
    mode = nd.NpuFastCopyMode()
    prof = torch.profiler.profile()
    with mode:
        prof.start()
        torch._foreach_copy_(*singles())
    torch.add(torch.ones(2), 1)  # after the block, still profiled
    prof.stop()
    names = {e.name for e in prof.events()}
    assert {"aten::_foreach_copy_", "aten::add"} <= names
    torch._foreach_copy_(*singles())  # outside: stock, uncounted
    with mode:  # and the mode still serves
        torch._foreach_copy_(*singles())
    assert served(mode) == 2


def test_verify_inside_a_default_mode_compares_with_stock():
    outer = nd.NpuFastCopyMode()
    with outer, nd.NpuFastCopyMode(verify=True) as inner:
        torch._foreach_copy_(*singles())
    # The reference stock copy is stock's: the outer mode's kernels did not serve it.
    assert served(outer) == 0 and served(inner) == 1


def test_a_default_mode_inside_a_strict_one_is_not_strict():
    d = [torch.zeros(3), torch.zeros(2, 2).t()]
    s = [torch.ones(3), torch.ones(2, 2)]
    with nd.NpuFastCopyMode(strict=True) as outer:
        with nd.NpuFastCopyMode() as inner:
            torch._foreach_copy_(d, s)  # a fallback pair: strict would raise
        with pytest.raises(nd.FastCopyFallbackError):
            torch._foreach_copy_(d, s)
    assert served(inner) == 1 and served(outer) == 0


def test_stats_outlive_the_mode_object():
    def block():
        mode = nd.NpuFastCopyMode()
        with mode:
            torch._foreach_copy_(*singles())
        return mode.stats

    stats = block()
    import gc

    gc.collect()
    assert stats.op_calls["aten._foreach_copy_"] == 1


def test_nested_entries_count_in_the_innermost_mode_and_exits_restore_the_outer():
    outer, inner = nd.NpuFastCopyMode(), nd.NpuFastCopyMode()
    with outer:
        torch._foreach_copy_(*singles())
        with inner:
            torch._foreach_copy_(*singles())
            with inner:  # the same mode entered twice
                torch._foreach_copy_(*singles())
        torch._foreach_copy_(*singles())
    torch._foreach_copy_(*singles())  # outside: stock, counted nowhere
    assert served(outer) == 2 and served(inner) == 2


def test_exits_out_of_order_raise_and_change_nothing():
    a, b = nd.NpuFastCopyMode(), nd.NpuFastCopyMode()
    a.__enter__()
    b.__enter__()
    with pytest.raises(RuntimeError, match="reverse order of entry"):
        a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    a.__exit__(None, None, None)
    torch._foreach_copy_(*singles())
    assert served(a) == 0 and served(b) == 0


def test_a_thread_started_in_the_block_copies_as_stock():
    mode = nd.NpuFastCopyMode()
    results = []

    def other():
        results.append(outcome(singles))

    with mode:
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert_same(outcome(singles), results[0])
    assert mode.stats.as_dict()["ops"] == {}


@torch.jit.script
def _scripted_copy(d: List[torch.Tensor], s: List[torch.Tensor]) -> int:
    torch._foreach_copy_(d, s)
    return 1


@torch.jit.script
def _scripted_fork(d: List[torch.Tensor], s: List[torch.Tensor]) -> int:
    return torch.jit.wait(torch.jit.fork(_scripted_copy, d, s))


def test_work_pytorch_launches_for_the_block_is_served():
    # TorchScript's fork runs on the inter-op pool through at::launch, which carries the caller's
    # thread-local state (the scope with it), as the autograd engine does for its device threads.
    mode = nd.NpuFastCopyMode()
    d, s = singles()
    with mode:
        _scripted_fork(d, s)
    assert served(mode) == 1
    ref_d, ref_s = singles()
    torch._foreach_copy_(ref_d, ref_s)
    assert all(torch.equal(bits(x), bits(y)) for x, y in zip(d, ref_d))


def test_backward_run_in_the_block_is_served():
    class CopyGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            out = [torch.empty(g.shape)]
            torch._foreach_copy_(out, [g.contiguous()])
            return out[0] * 2

    w = torch.randn(64, requires_grad=True)
    mode = nd.NpuFastCopyMode()
    with mode:
        CopyGrad.apply(w).sum().backward()
    assert served(mode) == 1 and torch.equal(w.grad, torch.full((64,), 2.0))


def test_threads_count_their_own_modes():
    n, threads = 200, 4
    modes = [nd.NpuFastCopyMode() for _ in range(threads)]
    go = threading.Barrier(threads + 1)
    errors = []

    def work(mode):
        try:
            d, s = singles()
            go.wait()
            with mode:
                for _ in range(n):
                    torch._foreach_copy_(d, s)
        except Exception as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(m,)) for m in modes]
    for t in ts:
        t.start()
    go.wait()
    reads = [m.stats.op_calls["aten._foreach_copy_"] for m in modes for _ in range(20)]  # drains meanwhile
    for t in ts:
        t.join()
    assert not errors and max(reads) <= n
    assert [m.stats.op_calls["aten._foreach_copy_"] for m in modes] == [n] * threads
    assert [m.stats.tensors["foreach"] for m in modes] == [3 * n] * threads


_OTHER_SCHEMA = r"""
import torch, npu_dispatch as nd
from npu_dispatch import _op_table
import torch.distributed.fsdp._fully_shard._fsdp_collectives  # defines fsdp::
# An owned fsdp op this torch lacks, defined with another schema before the mode's first use.
row = next(r for r in _op_table.rows() if r.namespace == "fsdp" and not hasattr(torch.ops.fsdp, r.op_name))
lib = torch.library.Library("fsdp", "FRAGMENT")
lib.define(f"{row.op_name}(Tensor[] inputs, Tensor out) -> Tensor")
ran = []
def kernel(inputs, out):
    ran.append(1)
    torch._foreach_copy_([out.clone()], [out])  # an owned op: counted with this call, not again
    return out.clone()
lib.impl(row.op_name, kernel, "CPU")
op = getattr(torch.ops.fsdp, row.op_name).default
out = torch.arange(3.0)
mode = nd.NpuFastCopyMode()
with mode:
    r = op([torch.zeros(1), torch.zeros(2)], out)
assert torch.equal(r, out) and ran == [1]
assert torch.equal(op([torch.zeros(1)], out), out) and ran == [1, 1]  # outside: uncounted
stats = mode.stats.as_dict()
assert list(stats["ops"]) == [row.counted], stats["ops"]
assert stats["fallbacks"] == {"schema": {"pairs": 2, "calls": 1}}, stats["fallbacks"]
assert stats["paths"]["stock"]["tensors"] == 2
print("ok")
"""


@interception_only
def test_an_owned_op_of_an_unknown_schema_passes_through_counted():
    # Each call of an owned op found with a schema the library was not written for runs the op's
    # own kernel; inside a mode it is counted under that op as stock, reason "schema".
    import subprocess
    import sys

    from npu_dispatch import _op_table

    if all(hasattr(torch.ops.fsdp, r.op_name) for r in _op_table.rows() if r.namespace == "fsdp"):
        pytest.skip("every owned fsdp op exists in this torch: none can be defined with another schema")
    out = subprocess.run([sys.executable, "-c", _OTHER_SCHEMA], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    assert "through to stock: unsupported fsdp::" in out.stderr


@interception_only
def test_only_an_owned_op_can_pass_through_counted():
    with pytest.raises(RuntimeError, match="not an owned op"):
        _native.module().install_passthrough("aten::add.Tensor")


_UNTESTED_TORCH = r"""
import os
os.environ["NPU_DISPATCH_INTERCEPTION"] = "0"  # as where a dispatcher fact fails
import torch, npu_dispatch as nd
from npu_dispatch import mode as mode_module
d, s = [torch.zeros(5, dtype=torch.bfloat16)], [torch.randn(5)]
ref = [torch.zeros(5, dtype=torch.bfloat16)]
torch._foreach_copy_(ref, s)
with nd.NpuFastCopyMode() as m:
    depth = torch._C._len_torch_dispatch_stack()
    torch._foreach_copy_(d, s)
assert depth == 1, depth  # the Python dispatch-mode path
assert torch.equal(d[0].view(torch.int16), ref[0].view(torch.int16)) and d[0]._version == ref[0]._version
assert m.stats.fast_path_calls == 1, m.stats.report()
assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_foreach_copy_", "BackendSelect")
print("ok")
"""


def test_where_the_interception_is_refused_the_python_mode_path_gives_stocks_results():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _UNTESTED_TORCH], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    assert "Python dispatch-mode path" in out.stderr
