"""Compile-first FSDP training, stock Inductor against Inductor with npu_dispatch's lowerings.

The model of ``examples/fsdp_train.py`` is sharded the SimpleFSDP way (``examples/simple_fsdp.py``:
DTensor ``Shard(0)`` parameters gathered and cast to bf16 by a parametrization, gradients
reduce-scattered in fp32), the whole model is compiled, and Inductor's collective bucketing merges
the all-gathers and reduce-scatters into buckets. Each rank builds the model twice from one seed:
one compiled with ``backend="inductor"``, one with ``backend="npu_dispatch"`` (the same Inductor,
with the lowerings of ``npu_dispatch.lowerings``). Both train on the same batches, taking steps
in turn (which goes first alternates). After every step the losses, the local gradient shards and
the local parameter shards are compared bit for bit.

For each bucket mode (``default``: ``cat`` + ``copy_``; ``custom_ops``: ``bucketing::`` ops, what
torchtitan's per-block bucketing uses) rank 0 prints the median step time of each, what the
generated code does to fill each bucket (kernels, extern calls, temporaries;
``npu_dispatch.lowerings.report``) and the host time of those copies in one profiled step.

    python examples/compiled_fsdp_train.py                              # 2 CPU ranks, gloo, both modes
    python examples/compiled_fsdp_train.py --bucket-mode custom_ops --steps 20
    python examples/compiled_fsdp_train.py --json                       # one JSON object at the end
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp_train import WARMUP_STEPS, _free_port, _positive, all_true, compare, corpus, step  # noqa: E402
from simple_fsdp import bucketing_config, data_parallel  # noqa: E402
from tiny_llama import Config, TinyLlama  # noqa: E402

from npu_dispatch.lowerings.report import TIMED_PREFIX, bucket_copies, time_bucket_copies  # noqa: E402

BUCKET_MODES = ("default", "custom_ops")
# Extern ops that fill a bucket in bucket mode custom_ops, with the collective they feed.
_EXTERN_COPIES = {"bucketing::_pre_bucket_all_gather": "all_gather", "bucketing::_pre_bucket_reduce_scatter": "reduce_scatter"}


def build(mesh):
    torch.manual_seed(0)
    cfg = Config()
    model = data_parallel(TinyLlama(cfg), mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return cfg, model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def new_modules(fn):
    """``fn()``, and the generated-code modules Inductor loaded while it ran."""
    from torch._inductor.codecache import PyCodeCache

    before = len(PyCodeCache.modules)
    out = fn()
    return out, PyCodeCache.modules[before:]


def code_summary(modules) -> list[dict]:
    """Per bucket of the generated code: collective, kernels, extern calls, temporary bytes."""
    rows = []
    for mod in modules:
        with open(mod.__file__) as f:
            for c in bucket_copies(f.read()):
                rows.append({"collective": c.collective, "kernels": len(c.kernels), "externs": c.externs,
                             "temp_bytes": c.temp_bytes})
    return rows


def copy_host_ms(modules, fn) -> dict:
    """Host ms spent filling buckets during ``fn()``, by collective, from torch.profiler."""
    for mod in modules:
        time_bucket_copies(mod)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    ms = {"all_gather": 0.0, "reduce_scatter": 0.0}
    for evt in prof.events():
        if evt.name.startswith(TIMED_PREFIX):
            ms[evt.name[len(TIMED_PREFIX):].split(":")[0]] += evt.cpu_time_total / 1e3
        elif evt.name in _EXTERN_COPIES:
            ms[_EXTERN_COPIES[evt.name]] += evt.cpu_time_total / 1e3
    return ms


def run_mode(bucket_mode: str, mesh, args, rank: int, world: int) -> dict:
    torch._dynamo.reset()
    cfg, stock_model, stock_opt = build(mesh)
    _, low_model, low_opt = build(mesh)
    compiled = {"stock": torch.compile(stock_model, backend="inductor"),
                "lowered": torch.compile(low_model, backend="npu_dispatch")}
    opts = {"stock": stock_opt, "lowered": low_opt}
    data = corpus()
    gen = torch.Generator().manual_seed(1234 + rank)
    losses = {"stock": [], "lowered": []}
    secs = {"stock": [], "lowered": []}
    modules = {"stock": [], "lowered": []}
    grads_equal, params_equal = [], []

    def batch():
        starts = torch.randint(0, data.numel() - cfg.seq - 1, (args.batch,), generator=gen)
        return torch.stack([data[s: s + cfg.seq + 1] for s in starts.tolist()])

    with torch._inductor.config.patch(bucketing_config(bucket_mode)):
        for k in range(args.steps):
            seq = batch()
            for name in (("stock", "lowered") if k % 2 == 0 else ("lowered", "stock")):
                dist.barrier()
                start = time.perf_counter()
                # The first step compiles (forward now, backward at its first run).
                loss, mods = new_modules(lambda: step(compiled[name], opts[name], cfg, seq, world))
                secs[name].append(time.perf_counter() - start)
                losses[name].append(loss)
                modules[name] += mods
            g, p = compare(stock_model, low_model)
            grads_equal.append(all_true(g, torch.device("cpu")))
            params_equal.append(all_true(p, torch.device("cpu")))
            stock_opt.zero_grad(set_to_none=True)
            low_opt.zero_grad(set_to_none=True)
        # One more step of each under the profiler, for the bucket copies' host time (not timed
        # above: the profiler records every op).
        seq = batch()
        copy_ms = {name: copy_host_ms(modules[name], lambda: step(compiled[name], opts[name], cfg, seq, world))
                   for name in ("stock", "lowered")}
    timed = {n: secs[n][WARMUP_STEPS:] or secs[n] for n in secs}
    return {
        "bucket_mode": bucket_mode,
        "losses_stock": losses["stock"],
        "losses_lowered": losses["lowered"],
        "losses_equal_every_step": [a.hex() for a in losses["stock"]] == [b.hex() for b in losses["lowered"]],
        "grads_equal_every_step": all(grads_equal),
        "params_equal_every_step": all(params_equal),
        "step_seconds_stock": statistics.median(timed["stock"]),
        "step_seconds_lowered": statistics.median(timed["lowered"]),
        "step_ratio_paired": statistics.median(b / a for a, b in zip(timed["stock"], timed["lowered"])),
        "step_seconds_stock_each": secs["stock"],
        "step_seconds_lowered_each": secs["lowered"],
        "timed_steps": len(timed["stock"]),
        "buckets_stock": code_summary(modules["stock"]),
        "buckets_lowered": code_summary(modules["lowered"]),
        "copy_ms_stock": copy_ms["stock"],
        "copy_ms_lowered": copy_ms["lowered"],
    }


def worker(rank: int, world: int, port: int, args, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        results = [run_mode(m, mesh, args, rank, world) for m in args.bucket_modes]
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump({"world_size": world, "steps": args.steps, "modes": results}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # As examples/fsdp_train.py: no interpreter teardown under gloo's threads.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=_positive, default=8)
    p.add_argument("--world-size", type=_positive, default=2)
    p.add_argument("--batch", type=_positive, default=4, help="sequences per rank per step")
    p.add_argument("--bucket-mode", choices=[*BUCKET_MODES, "both"], default="both")
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    args = p.parse_args(argv)
    args.bucket_modes = list(BUCKET_MODES) if args.bucket_mode == "both" else [args.bucket_mode]
    return args


def _bucket_line(row: dict) -> str:
    ext = ", ".join(row["externs"]) or "no extern call"
    return f"{row['kernels']} kernel(s), {ext}, temporaries {row['temp_bytes'] / 1024:.1f} KiB"


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        mp.spawn(worker, args=(args.world_size, _free_port(), args, out_path), nprocs=args.world_size)
        with open(out_path) as f:
            result = json.load(f)
    if args.json:
        print(json.dumps(result))
        return result
    for r in result["modes"]:
        print(f"\n== compile-first FSDP, bucket mode {r['bucket_mode']!r}: {result['world_size']} CPU ranks, "
              f"{result['steps']} steps, bf16 parameters, fp32 reduce-scatter")
        print(f"{'step':>4}  {'loss stock':>12}  {'loss lowered':>12}")
        for k, (a, b) in enumerate(zip(r["losses_stock"], r["losses_lowered"])):
            print(f"{k:>4}  {a:>12.6f}  {b:>12.6f}{'' if a.hex() == b.hex() else '  DIFFERS'}")
        print(f"bitwise equal after every step: losses {r['losses_equal_every_step']}, "
              f"gradients {r['grads_equal_every_step']}, parameters {r['params_equal_every_step']}")
        print(f"median step time over {r['timed_steps']} steps: stock Inductor {r['step_seconds_stock'] * 1e3:.1f} ms, "
              f"with the lowerings {r['step_seconds_lowered'] * 1e3:.1f} ms "
              f"(lowered / stock, step by step: {r['step_ratio_paired']:.2f}x)")
        print("generated code per bucket (rank 0): stock -> lowerings")
        for a, b in zip(r["buckets_stock"], r["buckets_lowered"]):
            print(f"  {a['collective']:<15} {_bucket_line(a)}  ->  {_bucket_line(b)}")
        print("bucket copy host time in one profiled step (rank 0): "
              + "; ".join(f"{k.replace('_', '-')} copy-in {r['copy_ms_stock'][k]:.3f} -> {r['copy_ms_lowered'][k]:.3f} ms"
                          for k in ("all_gather", "reduce_scatter")))
    return result


if __name__ == "__main__":
    main()
