"""FSDP2 setups Ascend trainers run (``fully_shard``, 2 gloo ranks), under NpuFastCopyMode put on
the training step with the decorator: fp16 parameters with an fp32 reduce (Ascend 910A has no
bf16), and a validation forward under ``torch.inference_mode()`` between training steps. Every
copy FSDP2 issues is served with no fallback, and the training is bitwise stock's: losses,
gradients and parameters after every step, and the validation outputs."""
from __future__ import annotations

import os
import socket
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cases import require_native, same_shards as _same, shard_bits as _bits

require_native(distributed=True)

STEPS = 3


def _model(param_dtype):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(),
                                                      torch.nn.Linear(40, 24)) for _ in range(3)])
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model:
        fully_shard(block, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _train(param_dtype, validate, mode, rank):
    """STEPS steps of the stock model and of the same model whose step the mode decorates; with
    `validate`, a forward under inference_mode after each step. Per step: (loss, grads, params,
    validation output) equal."""
    import npu_dispatch as nd  # noqa: F401

    stock, stock_opt = _model(param_dtype)
    fast, fast_opt = _model(param_dtype)

    def step(model, opt, x):
        loss = model(x).float().pow(2).mean()
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad()
        return loss.detach(), grads

    fast_step = mode(step)  # the decorator: the whole step (forward, backward, optimizer) in the mode
    gen = torch.Generator().manual_seed(rank)
    same = []
    for _ in range(STEPS):
        x = torch.randn(8, 24, generator=gen).to(param_dtype)
        stock_loss, stock_grads = step(stock, stock_opt, x)
        fast_loss, fast_grads = fast_step(fast, fast_opt, x)
        row = [torch.equal(_bits(stock_loss), _bits(fast_loss)), _same(stock_grads, fast_grads),
               _same(list(stock.parameters()), list(fast.parameters()))]
        if validate:
            with torch.inference_mode():
                want = stock(x)
                with mode:
                    got = fast(x)
            row.append(torch.equal(_bits(want), _bits(got)))
        same.append(tuple(row))
    return same


def _worker(rank, world, port, out):
    import npu_dispatch as nd

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = {}
        for name, dtype, validate in (("fp16_params_fp32_reduce", torch.float16, False),
                                      ("bf16_with_inference_validation", torch.bfloat16, True)):
            mode = nd.NpuFastCopyMode()
            same = _train(dtype, validate, mode, rank)
            result[name] = {"same": same, "ops": mode.stats.as_dict()["ops"],
                            "reasons": dict(mode.stats.fallback_reasons)}
        if rank == 0:
            torch.save(result, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown under gloo's threads


@pytest.fixture(scope="module")
def runs():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.spawn(_worker, args=(2, port, out), nprocs=2)
        return torch.load(out)


def _assert_all_served(run, ops_expected):
    ops = run["ops"]
    assert run["reasons"] == {}
    for op in ops_expected:
        assert ops[op]["calls"] > 0, op
        assert ops[op]["fast_calls"] == ops[op]["calls"], (op, ops[op])
        assert ops[op]["fallback_calls"] == 0, (op, ops[op])


def test_fp16_params_with_fp32_reduce_serve_every_copy_and_train_as_stock(runs):
    from cases import RS_COPY_IN

    run = runs["fp16_params_fp32_reduce"]
    assert run["same"] == [(True, True, True)] * STEPS
    # The reduce-scatter copy-in widens fp16 gradients into the fp32 buffer.
    _assert_all_served(run, ["aten._foreach_copy_", "fsdp.all_gather_copy_in", "fsdp.split_with_sizes_copy",
                             RS_COPY_IN])


def test_validation_under_inference_mode_serves_every_copy_and_matches_stock(runs):
    run = runs["bf16_with_inference_validation"]
    assert run["same"] == [(True, True, True, True)] * STEPS
    _assert_all_served(run, ["aten._foreach_copy_", "fsdp.all_gather_copy_in", "fsdp.split_with_sizes_copy"])
