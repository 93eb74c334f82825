"""FSDP2 (``fully_shard``, 2 gloo ranks) with ``torch.compile`` (Inductor) under NpuFastCopyMode.

From torch 2.13 FSDP2's hooks are wrapped in ``torch._dynamo.disable``, so the four copies (the bf16
cast ``aten._foreach_copy_``, ``fsdp.all_gather_copy_in``, ``fsdp.split_with_sizes_copy``,
``fsdp.chunk_cat``) run eagerly between the compiled regions, and the mode serves them there. Two
variants, each one spawned run shared by the tests: every block compiled on its own, and the
whole model compiled. Each rank trains two identical models from one seed, the stock one with no
mode and the other with every step's forward and backward inside a fresh ``NpuFastCopyMode()``;
the tests check that no copy op reaches a compiled graph (Dynamo's or Inductor's post-grad), that
the mode serves every copy of every step without a fallback, that the mode causes no compile of
its own, and that the training is bitwise stock's (losses, gradients and parameters after every
step)."""
from __future__ import annotations

import datetime
import os
import socket
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cases import require_native
from cases import RS_COPY_IN
from test_fsdp import _bits, _grads, _params, _same  # the bitwise comparisons of the eager FSDP2 test

require_native(distributed=True)

STEPS = 3
BLOCKS = 3
VARIANTS = ("per_block", "whole_model")
# Substrings of a graph node's target that name one of the copies the mode serves.
COPY_TARGETS = ("fsdp", "_foreach_copy", "all_gather_copy_in", "split_with_sizes_copy", "chunk_cat")
# The copies the mode must serve on every step: the cast and the copy-in at least (the copy-out
# and the reduce-scatter copy-in also where this torch's FSDP2 issues them: see _served_ops).
REQUIRED_OPS = ("aten._foreach_copy_", "fsdp.all_gather_copy_in")
OPTIONAL_OPS = ("fsdp.split_with_sizes_copy", RS_COPY_IN)


# ---- what runs in the spawned ranks -----------------------------------------------------------


def _recording_pass(graphs: list):
    """Inductor's ``post_grad_custom_post_pass``: records the call_function targets of every
    post-grad graph (forward and backward). Its uuid is new in every process, so Inductor's FX
    graph cache (left on, as by default) cannot answer a compile from an earlier run, which would
    skip the pass."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class Recorder(CustomGraphPass):
        def __init__(self):
            self.key = f"{__name__}.Recorder-{os.getpid()}-{os.urandom(8).hex()}"

        def __call__(self, graph: torch.fx.Graph) -> None:
            graphs.append([str(n.target) for n in graph.nodes if n.op == "call_function"])

        def uuid(self):
            return self.key

    return Recorder()


class _Backend:
    """Inductor (``compile_fx``), counting compiles and recording the targets of every Dynamo
    graph it is handed."""

    def __init__(self):
        self.compiles = 0
        self.graphs: list[list[str]] = []

    def __call__(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.compiles += 1
        self.graphs.append([str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")])
        return compile_fx(gm, example_inputs)


class _Block(torch.nn.Module):
    """Linear-GELU-Linear. Defined here, not built from torch.nn containers: Dynamo skips frames
    of torch.nn's files, and on torch 2.13 ``Sequential.compile()`` (``torch.compile`` of
    ``_call_impl``), and ``torch.compile`` of a fully_shard-ed ``Sequential`` (whose hooks break
    the graph), trace no frame at all, so nothing would be compiled."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(24, 40), torch.nn.Linear(40, 24)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(BLOCKS))

    def forward(self, x):
        # Unrolled: Dynamo skips a whole frame whose loop holds a graph break (FSDP's hooks).
        a, b, c = self.blocks
        return c(b(a(x)))


def _model(variant: str, backend):
    """``(model, what to call, optimizer)``: the model fully_shard-ed per block and at the root,
    bf16 parameters and fp32 reductions, compiled as ``variant`` says."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = _Net()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    # whole_model: Dynamo traces the root's forward and breaks the graph at each block's FSDP
    # hooks, so the graphs Inductor compiles are still the blocks' (the root adds no ops).
    if variant == "per_block":
        for block in model.blocks:
            block.compile(backend=backend)
        return model, model, opt
    return model, torch.compile(model, backend=backend), opt


def _worker(rank, world, port, variant, out):
    import torch._inductor.config as inductor_config

    import npu_dispatch as nd

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    post_grad: list[list[str]] = []
    inductor_config.post_grad_custom_post_pass = _recording_pass(post_grad)
    inductor_config.compile_threads = 1  # no compile-worker pool per rank on a small machine
    backend = _Backend()
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        stock_model, stock, stock_opt = _model(variant, backend)
        fast_model, fast, fast_opt = _model(variant, backend)
        gen = torch.Generator().manual_seed(rank)
        steps = []
        for _ in range(STEPS):
            x = torch.randn(8, 24, generator=gen)
            before = backend.compiles
            stock_loss = stock(x).float().pow(2).mean()
            stock_loss.backward()
            stock_compiles, before = backend.compiles - before, backend.compiles
            with nd.NpuFastCopyMode() as mode:
                fast_loss = fast(x).float().pow(2).mean()
                fast_loss.backward()
            fast_compiles = backend.compiles - before
            grads_equal = _same(_grads(stock_model), _grads(fast_model))
            stock_opt.step()
            fast_opt.step()
            params_equal = _same(_params(stock_model), _params(fast_model))
            steps.append({"loss": torch.equal(_bits(stock_loss), _bits(fast_loss)), "grads": grads_equal,
                          "params": params_equal, "ops": mode.stats.as_dict()["ops"],
                          "stock_compiles": stock_compiles, "fast_compiles": fast_compiles})
            stock_opt.zero_grad()
            fast_opt.zero_grad()
        torch.save({"steps": steps, "dynamo_graphs": backend.graphs, "post_grad_graphs": post_grad,
                    "compiles": backend.compiles}, f"{out}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown under gloo's threads


# ---- the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=VARIANTS)
def run(request):
    """One spawned 2-rank run of a variant: the results of both ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.spawn(_worker, args=(2, port, request.param, out), nprocs=2)
        return [torch.load(f"{out}.{rank}") for rank in range(2)]


def test_no_copy_op_reaches_a_compiled_graph(run):
    # Dynamo's graphs show any copy traced; the post-grad graphs those Inductor keeps as ops (a
    # traced aten._foreach_copy_ is decomposed before post-grad, an fsdp:: op stays a fallback).
    for rank in run:
        for kind in ("dynamo_graphs", "post_grad_graphs"):
            graphs = rank[kind]
            assert graphs, f"no {kind} captured: the check below would pass vacuously"
            targets = [t for g in graphs for t in g]
            assert any(w in t for t in targets for w in ("mm", "linear")), f"no matmul in the {kind}: {targets}"
            copies = sorted({t for t in targets if any(w in t for w in COPY_TARGETS)})
            assert not copies, f"copy ops compiled into the {kind}: {copies}"


def _served_ops(run) -> list[str]:
    ops = set(REQUIRED_OPS)
    for rank in run:
        for step in rank["steps"]:
            ops.update(op for op in OPTIONAL_OPS if op in step["ops"])
    return sorted(ops)


def test_every_step_the_mode_serves_the_copies_without_fallback(run):
    served = _served_ops(run)
    for rank in run:
        per_step = []
        for k, step in enumerate(rank["steps"]):
            ops = step["ops"]
            for op in served:
                assert op in ops and ops[op]["calls"] > 0, f"step {k}: the mode saw no {op}: {sorted(ops)}"
                assert ops[op]["fast_calls"] == ops[op]["calls"], f"step {k}: {op} off the fast path: {ops[op]}"
            assert all(v["fallback_calls"] == 0 and not v["fallbacks"] for v in ops.values()), \
                f"step {k}: fallbacks: { {op: v['fallbacks'] for op, v in ops.items()} }"
            # The blocks are resharded after forward: each is gathered (cast, copied in, copied
            # out) in forward and again in backward, and its gradients reduce-scattered once; the
            # root holds no parameters of its own.
            expected = {"aten._foreach_copy_": 2 * BLOCKS, "fsdp.all_gather_copy_in": 2 * BLOCKS,
                        "fsdp.split_with_sizes_copy": 2 * BLOCKS, RS_COPY_IN: BLOCKS}
            assert {op: ops[op]["calls"] for op in served} == {op: expected[op] for op in served}, f"step {k}"
            per_step.append({op: (v["calls"], v["fast_calls"]) for op, v in ops.items()})
        assert all(s == per_step[1] for s in per_step[1:]), f"calls per step changed: {per_step}"


def test_the_mode_causes_no_compile(run):
    for rank in run:
        steps = rank["steps"]
        # Stock runs first on every step, outside the mode; the model under the mode runs the
        # same code after it, inside the mode, and must find what stock compiled: a guard that
        # failed inside the mode (or anything else the mode made Dynamo compile) counts here.
        assert steps[0]["stock_compiles"] > 0, "nothing was compiled"
        assert [s["fast_compiles"] for s in steps] == [0] * STEPS, [(s["stock_compiles"], s["fast_compiles"])
                                                                     for s in steps]
        assert [s["stock_compiles"] for s in steps[1:]] == [0] * (STEPS - 1)
        assert rank["compiles"] == steps[0]["stock_compiles"]


def test_training_is_bitwise_stocks_after_every_step(run):
    for rank in run:
        assert [(s["loss"], s["grads"], s["params"]) for s in rank["steps"]] == [(True, True, True)] * STEPS
