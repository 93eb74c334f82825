"""Runs workloads: checks each bitwise against stock, times stock / direct / mode / roofline
interleaved, and derives ratios, efficiency, launches and the issue's targets.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import npu_dispatch
from npu_dispatch import NpuFastCopyMode, _native

from . import timing
from .workloads import DispatchArgs, ForeachArgs, Workload

__all__ = ["Config", "PassThroughMode", "NullMode", "NullRoute", "variants", "bitwise_check", "run_workload",
           "measure_workload", "finish_row", "metrics_of", "efficiency_bound"]


@dataclasses.dataclass(frozen=True)
class Config:
    """``rounds`` interleaved rounds of ``min_run_time`` seconds per variant, on ``threads`` threads."""

    rounds: int
    min_run_time: float
    threads: int


class PassThroughMode(TorchDispatchMode):
    """The cheapest possible dispatch mode: the floor any Python mode pays per op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class NullMode(TorchDispatchMode):
    """Receives ``aten._foreach_copy_`` and does nothing (not even the copy): what delivering the
    op's arguments to ``__torch_dispatch__`` costs, the lower bound of any dispatch mode that
    handles it. Other ops (the timer's own) pass through."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._foreach_copy_.default:
            return None
        return func(*args, **(kwargs or {}))


class NullRoute(TorchDispatchMode):
    """``aten._foreach_copy_`` taken by the native dispatch route (csrc/mode_route.h) and not
    copied: every call that passes the route's context checks (the lane's own checks are skipped),
    so what reaching the route costs (the stock binding's parse of both lists, the dispatcher, the
    route's look at the context), the lower bound of any mode that handles the op below the
    Python binding. With ``copy=(dst, src)`` (a pair the fast lane takes: contiguous CPU tensors
    of one shape and a dtype pair it copies exactly) the route copies ``src`` into ``dst`` on every
    call it takes instead, with the fast lane's kernel as the route runs it (on the calling thread
    up to 768 KB read plus written): reaching the route and moving a call's bytes as one flat
    copy, no per-pair work. Entering copies the pair once to check it (ValueError
    where the lane refuses it). One thread at a time: concurrent calls would write ``dst``
    together. Other ops (the timer's own) pass through."""

    def __init__(self, copy: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        self._copy = () if copy is None else tuple(copy)

    def __enter__(self):
        out = super().__enter__()
        try:
            _native.module().mode_route_enter(self, True, *self._copy)
        except BaseException:
            super().__exit__(None, None, None)
            raise
        return out

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            return super().__exit__(exc_type, exc_value, traceback)
        finally:
            _native.module().mode_route_exit(self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _fsdp_all_gather_copy_in():
    import torch.distributed.fsdp  # noqa: F401  registers fsdp::all_gather_copy_in

    return torch.ops.fsdp.all_gather_copy_in


def variants(args) -> list[timing.Variant]:
    """The variants timed for one workload's arguments.

    Copy workloads: ``stock`` (the stock op), ``direct`` (``npu_dispatch.foreach_copy_`` /
    ``all_gather_copy_in``), ``mode`` (the stock call under ``NpuFastCopyMode``), ``bare_mode``
    (the stock call under a do-nothing dispatch mode: the best any dispatch mode can do),
    ``null_mode`` (the stock call delivered to a dispatch mode that does nothing: a lower bound of
    any mode that handles the op in Python), ``roofline`` (one flat ``copy_`` of as many
    elements, same dtypes, between two
    contiguous buffers), and for foreach lists with the native library: ``pair_floor``, only the
    per-pair work any exact foreach copy repeats beyond the bytes (read every tensor's address and
    size, bump every destination's version counter; ``touch_pairs`` in csrc/python_entry.cpp),
    ``call_floor``, the same call on empty lists (its fixed cost, taken off the floors),
    ``flat_direct``, this library's kernel on the roofline's two flat buffers, and
    ``copy_floor`` / ``direct_copy_floor``, the roofline / flat_direct copy followed by the pair
    touches in one timed statement (the touches then meet the metadata as a real call does, after
    a copy has moved the bytes through the caches), and ``parallel_region``, one empty parallel
    region on every torch thread (what starting and joining them costs in that round), and
    ``null_route`` (:class:`NullRoute`: the lower bound of a mode below the binding),
    ``null_route_copy`` (the same, moving as many bytes as the roofline's one flat copy in the
    route: an estimate, not a bound, of a routed call that copies); for
    foreach lists also ``mode_front``, the stock call under ``NpuFastCopyMode(front=True)``.
    ``DispatchArgs``: ``no_mode``, ``bare_mode`` (:class:`PassThroughMode`), ``mode``.
    """
    V = timing.Variant
    if isinstance(args, DispatchArgs):
        g = {"torch": torch, "a": args.a, "b": args.b}
        stmt = "torch.add(a, b)"
        return [V("no_mode", stmt, g), V("bare_mode", stmt, g, PassThroughMode), V("mode", stmt, g, NpuFastCopyMode)]
    src_dtype, dst_dtype = args.dtypes
    numel = args.numel
    g = {
        "torch": torch,
        "flat_src": torch.randn(numel).to(src_dtype),
        "flat_dst": torch.zeros(numel, dtype=dst_dtype),
    }
    bounds = []  # foreach lists only: the front, and the variants the bounds come from
    if isinstance(args, ForeachArgs):
        g.update(dsts=args.dsts, srcs=args.srcs, foreach_copy_=npu_dispatch.foreach_copy_)
        stock, direct = "torch._foreach_copy_(dsts, srcs)", "foreach_copy_(dsts, srcs)"
        # The mode with its torch-function front (NpuFastCopyMode(front=True)): Python calls of
        # torch._foreach_copy_ that the fast lane takes skip the dispatcher's boxing.
        bounds.append(V("mode_front", stock, g, functools.partial(NpuFastCopyMode, front=True)))
        bounds.append(V("null_mode", stock, g, NullMode))
        module = _native.module()
        if module is not None:
            g.update(touch_pairs=module.touch_pairs, no_tensors=[], region_probe=module.region_probe)
            bounds += [V("null_route", stock, g, NullRoute),
                       V("null_route_copy", stock, g, functools.partial(NullRoute, (g["flat_dst"], g["flat_src"]))),
                       V("pair_floor", "touch_pairs(dsts, srcs)", g),
                      # An empty parallel region: on a VM its cost moves between levels, and
                      # every timing that spreads work over threads moves with it (per round).
                      V("parallel_region", "region_probe()", g),
                      V("call_floor", "touch_pairs(no_tensors, no_tensors)", g),
                      V("flat_direct", "foreach_copy_([flat_dst], [flat_src])", g),
                      # The pair touches right after the bytes moved, as in a real call: the
                      # copy has pushed the tensors' metadata out of the nearer caches.
                      V("copy_floor", "flat_dst.copy_(flat_src); touch_pairs(dsts, srcs)", g),
                      V("direct_copy_floor", "foreach_copy_([flat_dst], [flat_src]); touch_pairs(dsts, srcs)", g)]
    else:
        g.update(
            inputs=args.inputs, output=args.output, split_sizes=args.split_sizes, numel=args.numel,
            rank=args.rank, stock_op=_fsdp_all_gather_copy_in(),
            direct_op=npu_dispatch.all_gather_copy_in,
        )
        call = "(inputs, output, split_sizes, numel, rank)"
        stock, direct = "stock_op" + call, "direct_op" + call
    # bare_mode: the stock call under a do-nothing dispatch mode, the floor any TorchDispatchMode
    # pays (the dispatcher boxes every tensor of the lists into Python for __torch_dispatch__).
    return [V("stock", stock, g), V("direct", direct, g), V("mode", stock, g, NpuFastCopyMode),
            V("bare_mode", stock, g, PassThroughMode), V("roofline", "flat_dst.copy_(flat_src)", g)] + bounds


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


def copy_floor(med: dict) -> float | None:
    """The floor of an exact foreach copy of one workload (us): the faster of ``copy_floor`` and
    ``direct_copy_floor`` less ``call_floor``; None without the native library's variants."""
    if "copy_floor" not in med:
        return None
    return min(med["copy_floor"], med["direct_copy_floor"]) - med["call_floor"]


def run_workload(w: Workload, cfg: Config, log: Callable[[str], None] = lambda s: None) -> dict:
    """Check and time one workload in this process; returns its JSON row (times in microseconds)."""
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
        vs = variants(args)
    except (ImportError, RuntimeError, AttributeError) as e:  # e.g. torch without distributed / fsdp op
        return {"name": w.name, "description": w.description, "skipped": f"{type(e).__name__}: {e}"}, None
    by = {v.name: v for v in vs}
    row: dict = {"name": w.name, "description": w.description}
    if isinstance(args, DispatchArgs):
        row["kind"] = "dispatch"
    else:
        row["kind"] = "foreach" if isinstance(args, ForeachArgs) else "all_gather_copy_in"
        src_dtype, dst_dtype = args.dtypes
        row.update(pairs=args.pairs, elements=args.numel, src_dtype=str(src_dtype).removeprefix("torch."),
                   dst_dtype=str(dst_dtype).removeprefix("torch."),
                   bytes_moved=args.numel * (src_dtype.itemsize + dst_dtype.itemsize))
        log(f"{w.name}: bitwise check")
        row["bitwise_equal"] = bitwise_check(
            args.outputs, by["stock"].run_once,
            {k: by[k].run_once for k in ("direct", "mode", "mode_front") if k in by},
        )
        row["launches"], row["paths"] = _launches(by["stock"])
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
    # The estimates the checks are read against: a dispatch mode pays at least the delivery of the
    # op (null mode or null route, measured lower bounds; speedup_mode_estimate is shown beside
    # it, not read: the mode has come in under the null route + copy); a foreach copy,
    # efficiency_bound.
    ceilings = {"speedup_mode": metrics.get("speedup_mode_ceiling"),
                "efficiency_direct": metrics.get("efficiency_bound")}
    row["metrics"] = metrics
    row["checks"] = [
        {"target": str(tg), "metric": tg.metric, "value": metrics.get(tg.metric),
         "pass": tg.check(metrics.get(tg.metric)), "ceiling": ceilings.get(tg.metric),
         "reachable": ceilings.get(tg.metric) is None or tg.check(ceilings.get(tg.metric))}
        for tg in w.targets
    ]
    row["pass"] = all(c["pass"] for c in row["checks"]) and all(row.get("bitwise_equal", {}).values())
    return row


def metrics_of(kind: str, med: dict[str, float]) -> dict:
    """Speed-ups, efficiencies and bound estimates of one workload from its variants' median
    times (us); ``kind`` is a row's ``kind``."""
    if kind == "dispatch":
        metrics = {"extra_us_vs_bare_mode": med["mode"] - med["bare_mode"],
                   "extra_us_vs_no_mode": med["mode"] - med["no_mode"]}
    else:
        metrics = {
            "speedup_direct": _ratio(med["stock"], med["direct"]),
            "speedup_mode": _ratio(med["stock"], med["mode"]),
            "speedup_mode_front": _ratio(med["stock"], med["mode_front"]) if "mode_front" in med else None,
            "efficiency_direct": _ratio(med["roofline"], med["direct"]),
            "efficiency_mode": _ratio(med["roofline"], med["mode"]),
            "efficiency_stock": _ratio(med["roofline"], med["stock"]),
            "speedup_mode_floor": _ratio(med["stock"], med["bare_mode"]),
            # No dispatch mode that handles the op can beat this: it costs only the delivery, to
            # Python or to the native route, whichever is cheaper.
            "speedup_mode_ceiling": _ratio(med["stock"], _delivery_floor(med)),
            # An estimate, not a bound, of the best a dispatch mode that copies reaches: the
            # route's delivery with a call's bytes moved as one flat copy between other buffers,
            # plus the per-pair work timed alone (metadata hot, the optimistic of the floors' two
            # per-pair figures; it also reads the Python lists, which the route's binding has
            # already done, so it leans low). Cache effects can put a real call on either side.
            "speedup_mode_estimate": (
                _ratio(med["stock"], med["null_route_copy"] + max(med["pair_floor"] - med["call_floor"], 0.0))
                if "null_route_copy" in med and "pair_floor" in med else None),
            # Two estimates of the best efficiency an exact foreach copy of these lists reaches
            # here, from the fastest flat copy of the bytes measured plus the per-pair work
            # (its fixed call cost taken off): that work timed alone, its metadata hot in cache
            # (optimistic), and timed right after the copy in one statement, as a real call
            # meets it. Neither is a proof: a copy that spreads the per-pair work over threads,
            # or that leaves the metadata in cache, can beat both.
            "efficiency_bound_hot": (
                _ratio(med["roofline"], min(med["roofline"], med["flat_direct"])
                       + max(med["pair_floor"] - med["call_floor"], 0.0))
                if "pair_floor" in med else None),
            "efficiency_bound_after_copy": _ratio(med["roofline"], copy_floor(med)),
        }
        metrics["efficiency_bound"] = efficiency_bound(metrics)
    return metrics


def _delivery_floor(med: dict) -> float | None:
    known = [med[k] for k in ("null_mode", "null_route") if k in med]
    return min(known) if known else None


def efficiency_bound(metrics: dict) -> float | None:
    """The bound the efficiency checks read: the higher (more optimistic) of the two estimates in
    ``metrics``, so a miss is called beyond reach only when even that one says so."""
    known = [b for b in (metrics["efficiency_bound_hot"], metrics["efficiency_bound_after_copy"]) if b]
    return max(known) if known else None
