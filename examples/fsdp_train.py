"""FSDP2 training of a small Llama-style model, stock and under NpuFastCopyMode, compared bitwise.

Each rank trains with ``fully_shard`` per block and bf16 ``MixedPrecisionPolicy`` on a byte-level
corpus (the source text of Python's own ``difflib`` module). The same steps run twice from the
same seed: once stock, once under ``NpuFastCopyMode``; rank 0 reports both loss curves, whether
they are bitwise equal, the mode's stats and the host time spent in copy-in per path.

    python examples/fsdp_train.py --steps 20 --world-size 2          # CPU, gloo
    python examples/fsdp_train.py --device npu                       # Ascend, hccl (needs torch_npu)
    python examples/fsdp_train.py --steps 3 --json                   # one JSON object at the end
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_llama import Config, TinyLlama  # noqa: E402

import npu_dispatch  # noqa: E402


def corpus() -> torch.Tensor:
    """Bytes of a text file every Python ships, as int64 tokens."""
    path = importlib.util.find_spec("difflib").origin
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()


class CopyInTimer(TorchDispatchMode):
    """Host time in the two copy-in ops on the stock path (the fast run's mode times itself)."""

    def __init__(self):
        super().__init__()
        self.seconds = 0.0
        self.ops = {torch.ops.aten._foreach_copy_.default, torch.ops.fsdp.all_gather_copy_in.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in self.ops:
            return func(*args, **(kwargs or {}))
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.seconds += time.perf_counter() - start
        return out


def _copy_in_seconds(mode) -> float:
    if isinstance(mode, CopyInTimer):
        return mode.seconds
    return sum(v["seconds"] for v in mode.stats.as_dict()["ops"].values())


def train(args, device: torch.device, rank: int, world: int, mode) -> tuple[list[float], float]:
    """Losses per step, and host seconds in copy-in after the first step (a warm-up for both)."""
    torch.manual_seed(0)
    cfg = Config()
    model = TinyLlama(cfg).to(device)
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp_policy)
    fully_shard(model, mp_policy=mp_policy)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = corpus()
    gen = torch.Generator().manual_seed(1234 + rank)
    losses = []
    warm = 0.0
    with mode:
        for step in range(args.steps):
            if step == 1:
                warm = _copy_in_seconds(mode)
            starts = torch.randint(0, data.numel() - cfg.seq - 1, (args.batch,), generator=gen)
            seq = torch.stack([data[s: s + cfg.seq + 1] for s in starts.tolist()]).to(device)
            logits = model(seq[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, cfg.vocab), seq[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            # The global mean loss: every rank sees the same number.
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append((total / world).item())
    return losses, _copy_in_seconds(mode) - warm


def worker(rank: int, world: int, port: int, args, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args.device == "npu":
        import torch_npu  # noqa: F401  only here: it breaks `import torch` without CANN

        device, backend = torch.device("npu", rank), "hccl"
        torch.npu.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        timer = CopyInTimer()
        losses_stock, seconds_stock = train(args, device, rank, world, timer)
        fast = npu_dispatch.NpuFastCopyMode(front=args.front)
        losses_fast, seconds_fast = train(args, device, rank, world, fast)
        if rank == 0:
            stats = fast.stats.as_dict()
            result = {
                "steps": args.steps,
                "world_size": world,
                "device": args.device,
                "losses_stock": losses_stock,
                "losses_fast": losses_fast,
                "bitwise_equal": [x.hex() for x in losses_stock] == [x.hex() for x in losses_fast],
                "fast_path_calls": fast.stats.fast_path_calls,
                "fallback_calls": fast.stats.total_fallback_calls,
                "fast_path_calls_by_op": {op: v["fast_calls"] for op, v in stats["ops"].items()},
                "copy_in_seconds_stock": seconds_stock,
                "copy_in_seconds_fast": seconds_fast,
                "paths": stats["paths"],
                "fallback_reasons": stats["fallback_reasons"],
                "report": fast.stats.report(),
            }
            with open(out_path, "w") as f:
                json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Leave without interpreter teardown: under load, gloo's threads destroyed at exit can abort
    # the process ("terminate called without an active exception") after all the work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--device", choices=["cpu", "npu"], default="cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    p.add_argument("--front", action="store_true",
                   help="NpuFastCopyMode(front=True): Python calls of torch._foreach_copy_ skip the dispatcher")
    args = p.parse_args(argv)
    if args.device == "npu" and importlib.util.find_spec("torch_npu") is None:
        p.error("--device npu needs torch_npu and Ascend CANN: pip install 'npu-dispatch[npu]'")
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        mp.spawn(worker, args=(args.world_size, _free_port(), args, out_path), nprocs=args.world_size)
        with open(out_path) as f:
            result = json.load(f)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "report"}))
        return result
    print(f"FSDP2 on {args.world_size} {args.device} rank(s), {args.steps} steps, bf16 mixed precision")
    print(f"{'step':>4}  {'loss stock':>12}  {'loss fast':>12}")
    for k, (a, b) in enumerate(zip(result["losses_stock"], result["losses_fast"])):
        print(f"{k:>4}  {a:>12.6f}  {b:>12.6f}{'' if a.hex() == b.hex() else '  DIFFERS'}")
    print(f"\nlosses bitwise equal: {result['bitwise_equal']}")
    print(f"fast-path calls: {result['fast_path_calls']}, fallback calls: {result['fallback_calls']}\n")
    print(result["report"])
    print(f"\ncopy-in host time on rank 0 after the first step: stock {result['copy_in_seconds_stock'] * 1e3:.2f} ms, "
          f"fast {result['copy_in_seconds_fast'] * 1e3:.2f} ms")
    return result


if __name__ == "__main__":
    main()
