"""FSDP2 training of a small Llama-style model, stock and under NpuFastCopyMode, compared bitwise.

Each rank builds the same model twice from one seed, each with ``fully_shard`` per block and bf16
``MixedPrecisionPolicy``, and trains both on the same batches of a byte-level corpus (the source
text of Python's own ``difflib`` module), alternating: one step of the stock model with nothing on
the dispatch stack and one step of the other under ``NpuFastCopyMode()``, in turns (which goes
first alternates from step to step). After every step the
losses, the local gradient shards and the local parameter shards of the two models are compared
bit for bit. Rank 0 reports the median step time of each and their ratio, the four copies' calls and
host time per op (one extra profiled step of each, outside the timed ones) and the mode's stats,
then one verdict line: what the mode served, whether the step got faster or slower (with a 95 %
bootstrap band of the paired step ratios), and device launches per step on the emulated Ascend
device against stock (on CPU, one more short run of both models there counts them).

    python examples/fsdp_train.py --steps 20 --world-size 2          # CPU, gloo
    python examples/fsdp_train.py --device cuda                      # CUDA, nccl (one GPU per rank)
    python examples/fsdp_train.py --device npu                       # Ascend, hccl (needs torch_npu)
    python examples/fsdp_train.py --device npu --emulate --cann 8.0.RC3   # the emulated Ascend device

On ``--device npu`` with ``--emulate`` (npu_dispatch.testing.emulated_npu: host memory, launches
counted by op-plugin's rules) one more step of each model is run to count device launches per op
(cast, copy-in, ...); its step times are host times of an emulation, not an NPU's.
    python examples/fsdp_train.py --steps 3 --json                   # one JSON object at the end
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_llama import Config, TinyLlama  # noqa: E402

import npu_dispatch  # noqa: E402

# The four copies FSDP2 makes per all-gather group, as the profiler names them: the cast, the
# all-gather copy-in and copy-out, the reduce-scatter copy-in.
# torch 2.15's FSDP2 issues its reduce-scatter copy-in as fsdp::chunk_cat_mixed_dtype.
_RS_COPY_IN = ("fsdp::chunk_cat_mixed_dtype"
               if torch.distributed.is_available() and hasattr(torch.ops.fsdp, "chunk_cat_mixed_dtype")
               else "fsdp::chunk_cat")
COPY_OPS = ("aten::_foreach_copy_", "fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", _RS_COPY_IN)
# Steps not timed: the first ones allocate and warm caches.
WARMUP_STEPS = 2


def corpus() -> torch.Tensor:
    """Bytes of a text file every Python ships, as int64 tokens."""
    path = importlib.util.find_spec("difflib").origin
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()


def build(device: torch.device):
    torch.manual_seed(0)
    cfg = Config()
    model = TinyLlama(cfg).to(device)
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp_policy)
    fully_shard(model, mp_policy=mp_policy)
    return cfg, model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def step(model, opt, cfg, seq, world: int) -> float:
    """One training step; returns the global mean loss (every rank sees the same number)."""
    logits = model(seq[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, cfg.vocab), seq[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return (total / world).item()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = _local(a).detach().cpu(), _local(b).detach().cpu()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def compare(stock, fast) -> tuple[bool, bool]:
    """Whether every local gradient shard, and every local parameter shard, is bitwise equal."""
    grads = params = True
    for (name, p), (_, q) in zip(stock.named_parameters(), fast.named_parameters()):
        if (p.grad is None) != (q.grad is None) or (p.grad is not None and not _same(p.grad, q.grad)):
            grads = False
        if not _same(p, q):
            params = False
    return grads, params


@contextlib.contextmanager
def _quiet_stderr():
    """The process's stderr (fd 2) sent to /dev/null: the profiler's kineto writes a log line of
    its own there at every start and stop ("USDT: ... profiler_start")."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def profiled_copy_ms(fn) -> dict:
    """Host ms in each FSDP2 copy op during ``fn()``, from torch.profiler (CPU activity). A copy op
    called inside another (stock's ``all_gather_copy_in`` issues a ``_foreach_copy_``) counts
    only in the outer one, so the values add up to the copies' time."""
    with _quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    totals = {op: 0.0 for op in COPY_OPS}
    for evt in prof.events():
        if evt.name not in totals:
            continue
        parent = evt.cpu_parent
        while parent is not None and parent.name not in totals:
            parent = parent.cpu_parent
        if parent is None:
            totals[evt.name] += evt.cpu_time_total / 1e3
    return totals


def all_true(flag: bool, device: torch.device) -> bool:
    t = torch.tensor([0 if flag else 1], device=device)
    dist.all_reduce(t)
    return t.item() == 0


def counted_launches(fn) -> dict:
    """Device launches of one step by copy op (the emulated device counts them)."""
    from npu_dispatch.testing import emulated_npu

    with emulated_npu.launches_by_op() as by_op:
        fn()
    return {"launches": dict(by_op), "calls": by_op.calls}


def worker(rank: int, world: int, port: int, args, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args.device == "npu" and args.emulate:
        from npu_dispatch.testing import emulated_npu

        emulated_npu.install(cann=args.cann)
        device, backend = torch.device("npu", rank), f"cpu:gloo,npu:{emulated_npu.BACKEND}"
        torch.npu.set_device(device)
    elif args.device == "npu":
        import torch_npu  # noqa: F401  only here: it breaks `import torch` without CANN

        device, backend = torch.device("npu", rank), "hccl"
        torch.npu.set_device(device)
    elif args.device == "cuda":
        device, backend = torch.device("cuda", rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        cfg, stock_model, stock_opt = build(device)
        _, fast_model, fast_opt = build(device)
        mode = npu_dispatch.NpuFastCopyMode()
        data = corpus()
        gen = torch.Generator().manual_seed(1234 + rank)
        losses_stock, losses_fast, grads_equal, params_equal = [], [], [], []
        sec_stock, sec_fast = [], []

        def batch():
            starts = torch.randint(0, data.numel() - cfg.seq - 1, (args.batch,), generator=gen)
            return torch.stack([data[s: s + cfg.seq + 1] for s in starts.tolist()]).to(device)

        def timed(fn):
            dist.barrier()
            start = time.perf_counter()
            out = fn()
            return out, time.perf_counter() - start

        def fast_step(seq):
            with mode:
                return step(fast_model, fast_opt, cfg, seq, world)

        for k in range(args.steps):
            seq = batch()
            # Which model steps first alternates, so neither gains from running second.
            runs = [("stock", lambda: step(stock_model, stock_opt, cfg, seq, world)), ("fast", lambda: fast_step(seq))]
            for name, fn in (runs if k % 2 == 0 else runs[::-1]):
                loss, sec = timed(fn)
                (losses_stock if name == "stock" else losses_fast).append(loss)
                (sec_stock if name == "stock" else sec_fast).append(sec)
            g, p = compare(stock_model, fast_model)
            grads_equal.append(all_true(g, device))
            params_equal.append(all_true(p, device))
            stock_opt.zero_grad(set_to_none=True)
            fast_opt.zero_grad(set_to_none=True)
        # One more step of each under the profiler, for the copies' host time (not timed above:
        # the profiler records every op).
        seq = batch()
        copy_ms_stock = profiled_copy_ms(lambda: step(stock_model, stock_opt, cfg, seq, world))
        copy_ms_fast = profiled_copy_ms(lambda: fast_step(seq))
        launches = {}
        if args.device == "npu" and args.emulate:
            seq = batch()
            counted_stock = counted_launches(lambda: step(stock_model, stock_opt, cfg, seq, world))
            counted_fast = counted_launches(lambda: fast_step(seq))
            launches = {"launches_stock": counted_stock["launches"], "launches_fast": counted_fast["launches"],
                        "launch_counted_calls": counted_fast["calls"], "cann": args.cann}
        if rank == 0:
            timed_stock = sec_stock[WARMUP_STEPS:] or sec_stock
            timed_fast = sec_fast[WARMUP_STEPS:] or sec_fast
            med_stock, med_fast = statistics.median(timed_stock), statistics.median(timed_fast)
            stats = mode.stats.as_dict()
            result = {
                "steps": args.steps,
                "world_size": world,
                "device": args.device,
                "losses_stock": losses_stock,
                "losses_fast": losses_fast,
                "bitwise_equal": [x.hex() for x in losses_stock] == [x.hex() for x in losses_fast],
                "grads_equal_every_step": all(grads_equal),
                "params_equal_every_step": all(params_equal),
                "step_seconds_stock": med_stock,
                "step_seconds_fast": med_fast,
                "step_speedup": med_stock / med_fast,
                # The same comparison step by step: stock / fast of each pair of steps taken in
                # turn, whose median drifts less with the machine than two separate medians do.
                "step_speedup_paired": statistics.median(a / b for a, b in zip(timed_stock, timed_fast)),
                "step_seconds_stock_each": sec_stock,
                "step_seconds_fast_each": sec_fast,
                "timed_steps": len(timed_stock),
                "copy_ms_stock": copy_ms_stock,
                "copy_ms_fast": copy_ms_fast,
                "fast_path_calls": mode.stats.fast_path_calls,
                "fallback_calls": mode.stats.total_fallback_calls,
                "fast_path_calls_by_op": {op: v["fast_calls"] for op, v in stats["ops"].items()},
                "calls_by_op": {op: v["calls"] for op, v in stats["ops"].items()},
                "paths": stats["paths"],
                "fallback_reasons": stats["fallback_reasons"],
                "report": mode.stats.report(),
                **launches,
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


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=_positive, default=20)
    p.add_argument("--world-size", type=_positive, default=2)
    p.add_argument("--batch", type=_positive, default=4, help="sequences per rank per step")
    p.add_argument("--device", choices=["cpu", "cuda", "npu"], default="cpu")
    p.add_argument("--emulate", action="store_true",
                   help="with --device npu: the emulated Ascend device (npu_dispatch.testing.emulated_npu)")
    p.add_argument("--cann", default=None, metavar="VERSION",
                   help="with --emulate: the CANN version whose op-plugin rules the device models "
                        "(default 8.0.RC3)")
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    args = p.parse_args(argv)
    if args.emulate and args.device != "npu":
        p.error("--emulate needs --device npu")
    if args.cann is not None and not args.emulate:
        p.error("--cann needs --emulate (a real NPU reports its own CANN version)")
    if args.emulate:
        from npu_dispatch.testing import emulated_npu

        args.cann = args.cann or emulated_npu.DEFAULT_CANN
        ok, why = emulated_npu.available()
        if not ok:
            p.error(f"--emulate: {why}")
    elif args.device == "npu" and importlib.util.find_spec("torch_npu") is None:
        p.error("--device npu needs Ascend's torch_npu and CANN installed (see Ascend's install guide), "
                "or --emulate for the emulated device")
    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        p.error(f"--device cuda needs one GPU per rank: {torch.cuda.device_count()} visible, "
                f"--world-size {args.world_size}")
    return args


def _run(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        mp.spawn(worker, args=(args.world_size, _free_port(), args, out_path), nprocs=args.world_size)
        with open(out_path) as f:
            return json.load(f)


def step_ratio_band(stock: list, fast: list, seed: int = 0) -> tuple[float, float, float]:
    """``(median, low, high)`` of the timed steps' paired ratios stock / fast (each pair of steps
    taken in turn): the median, and a 95 % bootstrap interval of it (2,000 resamples, seeded)."""
    ratios = [a / b for a, b in zip(stock[WARMUP_STEPS:] or stock, fast[WARMUP_STEPS:] or fast)]
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return statistics.median(ratios), meds[int(0.025 * len(meds))], meds[int(0.975 * len(meds)) - 1]


def _per_step(by_op: dict) -> int:
    """Device launches of one counted step, over its copy ops and kernels."""
    return sum(sum(kernels.values()) for kernels in by_op.values())


def emulated_launches(args) -> dict | None:
    """Device launches per training step of each model on the emulated Ascend device (two ranks of
    ``--device npu --emulate``, one counted step each), or None where the device cannot load."""
    from npu_dispatch.testing import emulated_npu

    if not emulated_npu.available()[0]:
        return None
    npu_args = argparse.Namespace(**{**vars(args), "device": "npu", "emulate": True, "steps": 1,
                                     "cann": args.cann or emulated_npu.DEFAULT_CANN})
    # Its process group ("cpu:gloo,npu:emulated_hccl") warns at teardown that the emulated backend
    # has no hooks: C++ warnings below errors are left out of this extra run's output.
    level = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        r = _run(npu_args)
    finally:
        if level is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
        else:
            os.environ["TORCH_CPP_LOG_LEVEL"] = level
    return {"stock": _per_step(r["launches_stock"]), "fast": _per_step(r["launches_fast"]), "cann": npu_args.cann,
            "bitwise_equal": r["bitwise_equal"] and r["grads_equal_every_step"] and r["params_equal_every_step"]}


def verdict(result: dict) -> str:
    """One line: what the mode served, whether the step got faster or slower (with its noise band),
    and device launches per step on the emulated npu against stock."""
    exact = result["bitwise_equal"] and result["grads_equal_every_step"] and result["params_equal_every_step"]
    served = (f"the mode served {result['fast_path_calls']} copy calls on the fast path, "
              f"{result['fallback_calls']} fell back, bitwise {'equal' if exact else 'DIFFERENT'}")
    med, lo, hi = result["step_ratio_band"]
    change = "faster" if lo > 1 else "slower" if hi < 1 else "no measurable change"
    step = f"step {med:.2f}x of stock's speed ({change}: 95 % band {lo:.2f}x to {hi:.2f}x)"
    npu = result.get("npu_launches")
    launches = (f"emulated npu (CANN {npu['cann']}): {npu['stock']} -> {npu['fast']} launches per step"
                + ("" if npu.get("bitwise_equal", True) else ", bitwise DIFFERENT there")
                if npu else "emulated npu: not available here")
    return f"verdict: {served}; {step}; {launches}"


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = _run(args)
    result["step_ratio_band"] = step_ratio_band(result["step_seconds_stock_each"], result["step_seconds_fast_each"])
    if args.device == "npu" and args.emulate:
        result["npu_launches"] = {"stock": _per_step(result["launches_stock"]), "fast": _per_step(result["launches_fast"]),
                                  "cann": args.cann, "bitwise_equal": True}  # this run's parity: the verdict's own
    elif args.device == "cpu" and not args.json:
        result["npu_launches"] = emulated_launches(args)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "report"}))
        return result
    print(f"FSDP2 on {args.world_size} {args.device} rank(s), {args.steps} steps, bf16 mixed precision")
    print(f"{'step':>4}  {'loss stock':>12}  {'loss fast':>12}")
    for k, (a, b) in enumerate(zip(result["losses_stock"], result["losses_fast"])):
        print(f"{k:>4}  {a:>12.6f}  {b:>12.6f}{'' if a.hex() == b.hex() else '  DIFFERS'}")
    print(f"\nbitwise equal after every step: losses {result['bitwise_equal']}, "
          f"gradients {result['grads_equal_every_step']}, parameters {result['params_equal_every_step']}")
    print(f"median step time over {result['timed_steps']} steps: stock {result['step_seconds_stock'] * 1e3:.1f} ms, "
          f"NpuFastCopyMode {result['step_seconds_fast'] * 1e3:.1f} ms (the verdict compares them step by step)")
    print("copy host time in one profiled step (rank 0):")
    for op in COPY_OPS:
        print(f"  {op:<28} stock {result['copy_ms_stock'][op]:7.3f} ms   fast {result['copy_ms_fast'][op]:7.3f} ms")
    if "launches_stock" in result:
        print(f"device launches in one step by op (emulated npu, CANN {result['cann']}, rank 0):")
        for op in sorted(set(result["launches_stock"]) | set(result["launches_fast"])):
            a = sum(result["launches_stock"].get(op, {}).values())
            b = sum(result["launches_fast"].get(op, {}).values())
            print(f"  {op:<10} stock {a:5d}   fast {b:5d}")
    print(f"\nfast-path calls: {result['fast_path_calls']}, fallback calls: {result['fallback_calls']}\n")
    print(result["report"])
    print()
    print(verdict(result))
    return result


if __name__ == "__main__":
    main()
