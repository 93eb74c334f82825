"""Runs workloads: checks each bitwise against stock, times stock / direct / mode /
roofline interleaved, and derives ratios, efficiency, launches and the issue's targets; runs the
FSDP2 example once and reads its step times.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import gc
import json
import os
import subprocess
import sys
from typing import Callable

import torch

import npu_dispatch
from npu_dispatch import NpuFastCopyMode

from . import timing
from .workloads import ChunkCatArgs, CopyOutArgs, DispatchArgs, ExampleArgs, ForeachArgs, Workload

__all__ = ["Config", "variants", "bitwise_check", "run_workload", "measure_workload",
           "finish_row", "metrics_of", "run_example", "example_metrics", "subprocess_env", "EXAMPLE_TIMEOUT_S"]


@dataclasses.dataclass(frozen=True)
class Config:
    """``rounds`` interleaved rounds of ``min_run_time`` seconds per variant, on ``threads`` threads;
    ``quick``: the short run (fewer example steps)."""

    rounds: int
    min_run_time: float
    threads: int
    quick: bool = False


def _fsdp_all_gather_copy_in():
    import torch.distributed.fsdp  # noqa: F401  registers fsdp::all_gather_copy_in

    return torch.ops.fsdp.all_gather_copy_in


def variants(args) -> list[timing.Variant]:
    """The variants timed for one workload's arguments.

    Copy workloads: ``stock`` (the stock op), ``direct`` (``npu_dispatch.foreach_copy_`` /
    ``all_gather_copy_in``), ``mode`` (the stock call under ``NpuFastCopyMode()``), ``roofline``
    (one flat ``copy_`` of as many elements, same dtypes, between two contiguous buffers), and
    ``DispatchArgs``: ``no_mode``, ``mode`` (inside ``NpuFastCopyMode()``), ``debug_mode``
    (inside ``NpuFastCopyMode(strict=True)``, which pushes a Python dispatch mode).
    """
    V = timing.Variant
    if isinstance(args, DispatchArgs):
        g = {"torch": torch, "a": args.a, "b": args.b}
        stmt = "torch.add(a, b)"
        return [V("no_mode", stmt, g), V("mode", stmt, g, NpuFastCopyMode),
                V("debug_mode", stmt, g, functools.partial(NpuFastCopyMode, strict=True))]
    src_dtype, dst_dtype = args.dtypes
    numel = args.numel
    g = {
        "torch": torch,
        "flat_src": torch.randn(numel).to(src_dtype),
        "flat_dst": torch.zeros(numel, dtype=dst_dtype),
    }
    if isinstance(args, ForeachArgs):
        g.update(dsts=args.dsts, srcs=args.srcs, foreach_copy_=npu_dispatch.foreach_copy_)
        stock, direct = "torch._foreach_copy_(dsts, srcs)", "foreach_copy_(dsts, srcs)"
    elif isinstance(args, CopyOutArgs):
        importlib.import_module("torch.distributed.fsdp")  # registers fsdp::split_with_sizes_copy
        g.update(src=args.all_gather_output, sizes=args.split_sizes, out=args.out,
                 stock_op=torch.ops.fsdp.split_with_sizes_copy, direct_op=npu_dispatch.split_with_sizes_copy)
        stock, direct = "stock_op(src, sizes, dim=1, out=out)", "direct_op(src, sizes, 1, out=out)"
    elif isinstance(args, ChunkCatArgs):
        importlib.import_module("torch.distributed.fsdp")  # registers fsdp::chunk_cat
        g.update(tensors=args.tensors, n=args.num_chunks, out=args.out, stock_op=torch.ops.fsdp.chunk_cat,
                 direct_op=npu_dispatch.chunk_cat)
        stock, direct = "stock_op(tensors, 0, n, out=out)", "direct_op(tensors, 0, n, out=out)"
    else:
        g.update(
            inputs=args.inputs, output=args.output, split_sizes=args.split_sizes, numel=args.numel,
            rank=args.rank, stock_op=_fsdp_all_gather_copy_in(),
            direct_op=npu_dispatch.all_gather_copy_in,
        )
        call = "(inputs, output, split_sizes, numel, rank)"
        stock, direct = "stock_op" + call, "direct_op" + call
    return [V("stock", stock, g), V("direct", direct, g), V("mode", stock, g, NpuFastCopyMode),
            V("roofline", "flat_dst.copy_(flat_src)", g)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def bitwise_check(outputs: list[torch.Tensor], stock: Callable[[], None],
                  ours: dict[str, Callable[[], None]]) -> dict[str, bool]:
    """Run ``stock`` then each of ``ours`` from zeroed ``outputs``; True where every bit matches.

    ``outputs`` are the tensors the calls write (zeroed in place, so views stay views).
    """
    def fresh() -> None:
        for t in outputs:
            t.zero_()

    fresh()
    stock()
    ref = [_bits(t).clone() for t in outputs]
    result = {}
    for name, fn in ours.items():
        fresh()
        fn()
        result[name] = all(torch.equal(_bits(t), r) for t, r in zip(outputs, ref))
    return result


def _launches(stock: timing.Variant) -> tuple[int, dict]:
    """Device launches and per-path pair counts of one stock call under a fresh NpuFastCopyMode."""
    mode = NpuFastCopyMode()
    with mode:
        exec(stock.stmt, stock.globals)
    d = mode.stats.as_dict()["paths"]
    return sum(p["launches"] for p in d.values()), {k: v["tensors"] for k, v in d.items() if v["calls"]}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def run_workload(w: Workload, cfg: Config, log: Callable[[str], None] = lambda s: None) -> dict:
    """Check and time one workload in this process; returns its JSON row (times in microseconds).
    A workload that runs an example (``fsdp_step``) runs it once: :func:`run_example`."""
    if w.once:
        return run_example(w, cfg, log)
    row, t = measure_workload(w, cfg, log)
    return row if t is None else finish_row(w, row, t)


def measure_workload(w: Workload, cfg: Config, log: Callable[[str], None] = lambda s: None,
                     first_round: int = 0) -> tuple[dict, dict[str, timing.Timing] | None]:
    """Build one workload, check it bitwise against stock and time its variants (rounds
    ``first_round`` on of the rotation); returns (its JSON row without times and metrics, the
    timings), the timings None where the workload is skipped. :func:`finish_row` completes it."""
    log(f"{w.name}: building")
    try:
        args = w.build()
        if isinstance(args, ExampleArgs):
            raise TypeError(f"{w.name} runs an example: run_workload, not measure_workload")
        vs = variants(args)
    except (ImportError, RuntimeError, AttributeError) as e:  # e.g. torch without distributed / fsdp op
        return {"name": w.name, "description": w.description, "skipped": f"{type(e).__name__}: {e}"}, None
    by = {v.name: v for v in vs}
    row: dict = {"name": w.name, "description": w.description}
    if isinstance(args, DispatchArgs):
        row["kind"] = "dispatch"
    else:
        row["kind"] = ("foreach" if isinstance(args, ForeachArgs) else "copy_out" if isinstance(args, CopyOutArgs)
                       else "chunk_cat" if isinstance(args, ChunkCatArgs) else "all_gather_copy_in")
        src_dtype, dst_dtype = args.dtypes
        row.update(pairs=args.pairs, elements=args.numel, src_dtype=str(src_dtype).removeprefix("torch."),
                   dst_dtype=str(dst_dtype).removeprefix("torch."),
                   bytes_moved=args.numel * (src_dtype.itemsize + dst_dtype.itemsize))
        log(f"{w.name}: bitwise check")
        row["bitwise_equal"] = bitwise_check(
            args.outputs, by["stock"].run_once,
            {k: by[k].run_once for k in ("direct", "mode")},
        )
        row["launches"], row["paths"] = _launches(by["stock"])
        if isinstance(args, CopyOutArgs):
            row["stock_launches"] = len(args.out)  # stock: one strided copy_ per parameter
        elif isinstance(args, ChunkCatArgs):  # stock: a zero fill and a copy per padded tensor, one cat
            n = args.num_chunks
            row["stock_launches"] = 1 + 2 * sum(t.shape[0] % n != 0 for t in args.tensors)
        else:
            row["stock_launches"] = args.pairs  # the stock CPU op: one copy_ per pair
    log(f"{w.name}: timing {', '.join(by)} x {cfg.rounds} rounds")
    t = timing.interleaved(vs, rounds=cfg.rounds, min_run_time=cfg.min_run_time, threads=cfg.threads,
                           first_round=first_round)
    del args, vs, by
    gc.collect()
    return row, t


def finish_row(w: Workload, row: dict, t: dict[str, timing.Timing], metrics: dict | None = None) -> dict:
    """Complete a row of :func:`measure_workload` from its timings: medians, the ``metrics``
    (by default :func:`metrics_of` the medians; merged over processes, the median of each
    process's, so that every ratio pairs times of one process) and the checks against
    ``w.targets``."""
    row["times_us"] = {k: v.as_dict() for k, v in t.items()}
    if metrics is None:
        metrics = metrics_of(row["kind"], {k: v.median_us for k, v in t.items()})
    return _checked(w, row, metrics)


def _checked(w: Workload, row: dict, metrics: dict) -> dict:
    """``row`` with its ``metrics``, the checks against ``w.targets`` and its verdict (every
    target met and every bitwise comparison equal)."""
    row["metrics"] = metrics
    row["checks"] = [{"target": str(tg), "metric": tg.metric, "value": metrics.get(tg.metric),
                      "pass": tg.check(metrics.get(tg.metric))} for tg in w.targets]
    row["pass"] = all(c["pass"] for c in row["checks"]) and all(row.get("bitwise_equal", {}).values())
    return row


def metrics_of(kind: str, med: dict[str, float]) -> dict:
    """Speed-ups and efficiencies of one workload from its variants' median times (us); ``kind``
    is a row's ``kind``."""
    if kind == "dispatch":
        return {"extra_us_vs_no_mode": med["mode"] - med["no_mode"],
                "debug_extra_us_vs_no_mode": med["debug_mode"] - med["no_mode"]}
    metrics = {
        "speedup_direct": _ratio(med["stock"], med["direct"]),
        "speedup_mode": _ratio(med["stock"], med.get("mode")),
        "efficiency_direct": _ratio(med["roofline"], med["direct"]),
        "efficiency_mode": _ratio(med["roofline"], med["mode"]),
    }
    metrics["mode_vs_bound"] = _ratio(metrics["speedup_mode"], metrics["speedup_direct"])
    return metrics


# Far above a full run here (40 steps: about half a minute).
EXAMPLE_TIMEOUT_S = 900


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subprocess_env() -> dict:
    """The environment of the suite's subprocesses: they import the npu_dispatch this process
    runs, wherever the working directory is."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
    return env


def run_example(w: Workload, cfg: Config, log: Callable[[str], None] = lambda s: None) -> dict:
    """Run ``w``'s example once in a subprocess and return its row (:func:`example_metrics` of the
    example's JSON); skipped where the example is not there, an error row where it fails."""
    row: dict = {"name": w.name, "description": w.description, "kind": "example"}
    try:
        args = w.build()
    except OSError as e:
        row["skipped"] = f"{type(e).__name__}: {e}"
        return row
    steps = args.quick_steps if cfg.quick else args.steps
    cmd = [sys.executable, args.script, "--steps", str(steps)] + list(args.argv)
    log(f"{w.name}: {' '.join(cmd[1:])}")
    try:
        done = subprocess.run(cmd, env=subprocess_env(), stdout=subprocess.PIPE, timeout=EXAMPLE_TIMEOUT_S, text=True)
    except subprocess.TimeoutExpired:
        return dict(row, error=f"example timed out after {EXAMPLE_TIMEOUT_S} s")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return dict(row, error=f"example exited with {done.returncode}, {len(lines)} JSON lines (its stderr is above)")
    try:
        result = json.loads(lines[-1])
        m = example_metrics(result)
        row.update(steps=result["steps"], timed_steps=result["timed_steps"], world_size=result["world_size"],
                   fast_path_calls=result["fast_path_calls"], fallback_calls=result["fallback_calls"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return dict(row, error=f"unexpected output of the example: {type(e).__name__}: {e}")
    row["command"] = " ".join(["python", os.path.relpath(args.script, _ROOT)] + cmd[2:])
    row["bitwise_equal"] = {"losses": m["bitwise_equal"], "grads": m["grads_equal_every_step"],
                            "params": m["params_equal_every_step"]}
    return _checked(w, row, m)


def example_metrics(result: dict) -> dict:
    """The metrics of ``fsdp_step`` from examples/fsdp_train.py's ``--json`` object: median step
    seconds without and under the mode (interleaved steps of one run) and their ratio, the copy
    ops' host ms in one profiled step of each, the copies' share of the stock step, and whether
    losses, gradients and parameters stayed bitwise equal."""
    stock, fast = result["step_seconds_stock"], result["step_seconds_fast"]
    copy_stock, copy_fast = sum(result["copy_ms_stock"].values()), sum(result["copy_ms_fast"].values())
    return {
        "step_seconds_stock": stock,
        "step_seconds_fast": fast,
        "step_speedup": _ratio(stock, fast),
        "copy_ms_stock": copy_stock,
        "copy_ms_fast": copy_fast,
        "copy_share_stock": _ratio(copy_stock, 1000 * stock),
        "bitwise_equal": bool(result["bitwise_equal"]),
        "grads_equal_every_step": bool(result["grads_equal_every_step"]),
        "params_equal_every_step": bool(result["params_equal_every_step"]),
    }
