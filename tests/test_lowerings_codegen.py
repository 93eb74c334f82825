"""Generated code and results of the copy lowerings on FSDP2's copy-in graph (``lowerings/``).

Each case compiles the graph with the plain ``"inductor"`` backend after ``register(strategy)``,
reads the generated wrapper (``run_and_get_code``), and compares every byte of the all-gather
output against the same graph run eagerly with the stock ops.
"""
from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import npu_dispatch.lowerings as ndl
from copy_in_graphs import assert_same_bits, fsdp_copy_in, shards

SIZES = [5, 17, 1, 33, 8, 64, 3]  # uneven, one single-element shard
WORLD = 4
FALLBACK = "torch.ops.fsdp.all_gather_copy_in"
NATIVE = "torch.ops.npu_dispatch.foreach_copy_.default("
CASES = [
    (torch.bfloat16, 0), (torch.bfloat16, 1), (torch.bfloat16, WORLD - 1),
    (torch.float32, 2), (torch.uint8, 0), (torch.uint8, WORLD - 1),
]


@pytest.fixture
def lowering(request):
    torch._dynamo.reset()
    ndl.register(request.param)
    yield request.param
    ndl.unregister()
    torch._dynamo.reset()


def _run(dtype, rank, compiled: str):
    """Compile and run the copy-in graph; ``compiled`` names the lowering in force."""
    f, split, numel = fsdp_copy_in(SIZES, rank, WORLD, dtype)
    sh = shards(SIZES)
    # Bytes outside this rank's slice must survive untouched: start from the same noise.
    noise = torch.randint(0, 256, (WORLD * numel * torch.empty((), dtype=dtype).element_size(),),
                          generator=torch.Generator().manual_seed(7), dtype=torch.uint8)
    out_ref, out = noise.clone().view(dtype), noise.clone().view(dtype)
    ref = f(sh, out_ref)
    result, code = run_and_get_code(torch.compile(f, fullgraph=True), sh, out)
    # An Inductor-generated bf16 cast (fused, stock): NaN payloads may differ (assert_same_bits).
    exact = not (compiled in ("fused", "stock") and dtype == torch.bfloat16)
    assert_same_bits(result[1], ref[1], nan_payload=exact)
    assert_same_bits(result[0], ref[0], nan_payload=exact)
    # (all_gather_input, all_gather_output) alias the output buffer, as eager's do.
    assert result[1] is out
    assert result[0].untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
    assert result[0].storage_offset() == numel * rank and result[0].numel() == numel
    return "\n".join(code)


@pytest.mark.parametrize("lowering", ["fused"], indirect=True)
@pytest.mark.parametrize("dtype,rank", CASES)
def test_fused_writes_into_the_output_without_fallback_or_buffers(lowering, dtype, rank):
    code = _run(dtype, rank, "fused")
    body = code.split("def call(")[1]
    assert FALLBACK not in code
    assert "empty_strided" not in body, "fused copy-in materialised intermediate buffers"
    calls = [ln.split("=", 1)[1].split("(")[0].strip() for ln in body.splitlines() if "= torch.ops." in ln]
    # Only the byte views FSDP takes of mixed-dtype shards (no data moves) may stay op calls.
    assert set(calls) <= {"torch.ops.aten.view.dtype"}, f"fused copy-in left extern calls: {calls}"
    if dtype != torch.uint8:  # byte views of fp32 shards are extern views, between which kernels split
        assert body.count("cpp_fused_") == 1, "expected the cast and copy-in in one C++ kernel"


@pytest.mark.parametrize("lowering", ["native"], indirect=True)
@pytest.mark.parametrize("dtype,rank", CASES)
def test_native_calls_our_op_once_per_node(lowering, dtype, rank):
    code = _run(dtype, rank, "native")
    assert FALLBACK not in code
    # uint8: the copy-in alone; bf16 / fp32: the cast into the flat buffer, then the copy-in.
    assert code.count(NATIVE) == (1 if dtype == torch.uint8 else 2)


def test_without_lowerings_inductor_keeps_the_python_fallback():
    # What the assertions above guard against: stock Inductor calls fsdp's Python kernel.
    torch._dynamo.reset()
    assert not ndl.is_registered()
    code = _run(torch.bfloat16, 1, "stock")
    assert FALLBACK in code
