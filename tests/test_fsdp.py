"""FSDP2 (``fully_shard``, 2 gloo ranks) under NpuFastCopyMode: every all-gather of a step, those
backward issues again after ``reshard_after_forward=True`` included, takes the fast path, and the
training is bitwise stock's (losses, gradients and parameters after every step)."""
from __future__ import annotations

import os
import socket
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from cases import require_native, same_shards as _same, shard_bits as _bits

require_native(distributed=True)

STEPS = 2


class _CountCopyIns(TorchDispatchMode):
    """Counts stock's fsdp.all_gather_copy_in calls (the reference count; not timed)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.fsdp.all_gather_copy_in.default:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _model():
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(),
                                                      torch.nn.Linear(40, 24)) for _ in range(3)])
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model:
        fully_shard(block, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _params(model):
    return list(model.parameters())


def _grads(model):
    return [p.grad for p in model.parameters()]


def _worker(rank, world, port, out):
    import npu_dispatch as nd

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        stock, stock_opt = _model()
        fast, fast_opt = _model()
        mode = nd.NpuFastCopyMode()
        gen = torch.Generator().manual_seed(rank)
        same, stock_calls = [], 0
        for _ in range(STEPS):
            x = torch.randn(8, 24, generator=gen)
            counter = _CountCopyIns()
            with counter:
                stock_loss = stock(x).float().pow(2).mean()
                stock_loss.backward()
            stock_calls += counter.calls
            with mode:
                fast_loss = fast(x).float().pow(2).mean()
                fast_loss.backward()
            grads_equal = _same(_grads(stock), _grads(fast))
            stock_opt.step()
            fast_opt.step()
            params_equal = _same(_params(stock), _params(fast))
            same.append((stock_loss.item() == fast_loss.item(), grads_equal, params_equal))
            stock_opt.zero_grad()
            fast_opt.zero_grad()
        stats = mode.stats.as_dict()["ops"]
        if rank == 0:
            torch.save({"same": same, "stock_calls": stock_calls, "ops": stats}, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown under gloo's threads


def test_every_all_gather_of_forward_and_backward_takes_the_fast_path_and_training_is_stocks():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.spawn(_worker, args=(2, port, out), nprocs=2)
        result = torch.load(out)
    # 3 blocks resharded after forward: gathered in forward and again in backward (the root holds
    # no parameters of its own, so it gathers nothing).
    assert result["stock_calls"] == STEPS * (3 + 3)
    ops = result["ops"]
    assert ops["fsdp.all_gather_copy_in"]["calls"] == result["stock_calls"]
    assert ops["fsdp.all_gather_copy_in"]["fast_calls"] == result["stock_calls"]
    assert ops["aten._foreach_copy_"]["fast_calls"] == result["stock_calls"]  # the bf16 cast of each
    assert all(v["fallback_calls"] == 0 for v in ops.values())
    assert result["same"] == [(True, True, True)] * STEPS
