"""Each workload in fresh worker processes, their results merged (``--processes``).

Where a workload's tensors land in memory moves its small-copy timings (run after ``tiny_many``,
``small_many``'s tensors fill the holes ``tiny_many`` left).
A single process measures one such layout, chosen by the workloads before it. So, as pyperf
does, the suite runs each workload in several fresh processes, one after another (never at once:
they would share the cores). Times are the median of the processes' medians
(``timing.Timing.merge``); ratios and efficiencies are computed in each process, from its own
interleaved times, and the median of those is reported. Rows keep each process's medians and
metrics. A workload that starts its own processes (``once``: ``fsdp_step``) runs once, here.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Callable

from . import suite, timing
from .workloads import Workload

__all__ = ["run_in_workers", "worker_main", "WORKER_TIMEOUT_S"]

# Far above any workload's full run here (llama_block_copy_in: about 40 s a process).
WORKER_TIMEOUT_S = 1800


def _run_worker(w: Workload, cfg: suite.Config, first_round: int) -> dict:
    """One worker process's result; raises RuntimeError if it fails, times out or answers nothing."""
    with tempfile.TemporaryDirectory(prefix="npu_dispatch_bench_") as tmp:
        path = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "benchmarks", "--worker", "--only", w.name,
               "--rounds", str(cfg.rounds), "--min-run-time", repr(cfg.min_run_time),
               "--threads", str(cfg.threads), "--first-round", str(first_round), "--result", path]
        try:
            done = subprocess.run(cmd, env=suite.subprocess_env(), timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"worker timed out after {WORKER_TIMEOUT_S} s") from None
        if done.returncode != 0:
            raise RuntimeError(f"worker exited with {done.returncode} (its stderr is above)")
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise RuntimeError(f"worker wrote no result: {e}") from None


def _median(values: list) -> float | None:
    """The median, or None where any process lacks the value."""
    return None if None in values else statistics.median(values)


def _merged_metrics(process_metrics: list[dict]) -> dict:
    """Each metric's median over the processes (None where any process lacks it)."""
    return {k: _median([m[k] for m in process_metrics]) for k in process_metrics[0]}


def run_in_workers(w: Workload, cfg: suite.Config, processes: int,
                   log: Callable[[str], None] = lambda s: None) -> dict:
    """Measure ``w`` in ``processes`` fresh processes, ``cfg.rounds`` rounds each (continuing the
    rotation of variants), and return its merged row. A worker that fails makes the row an error
    (``{"name", "description", "error"}``, reported as ERROR) rather than ending the suite.
    A ``once`` workload runs once in this process instead (:func:`suite.run_workload`)."""
    if w.once:
        return suite.run_workload(w, cfg, log)
    parts = []
    for p in range(processes):
        log(f"{w.name}: worker process {p + 1} of {processes}")
        try:
            parts.append(_run_worker(w, cfg, p * cfg.rounds))
        except RuntimeError as e:
            log(f"{w.name}: ERROR in process {p + 1}: {e}")
            return {"name": w.name, "description": w.description, "error": f"process {p + 1}: {e}"}
    rows = [part["row"] for part in parts]
    if any("skipped" in r for r in rows):
        return next(r for r in rows if "skipped" in r)
    names = set(parts[0]["timings"])
    if any(set(part["timings"]) != names for part in parts):
        error = "worker processes timed different variants (did the native library load in each?)"
        log(f"{w.name}: ERROR: {error}")
        return {"name": w.name, "description": w.description, "error": error}
    row = rows[0]
    if "bitwise_equal" in row:
        row["bitwise_equal"] = {k: all(r["bitwise_equal"][k] for r in rows) for k in row["bitwise_equal"]}
    per = [{name: timing.Timing(**part["timings"][name]) for name in names} for part in parts]
    merged = {name: timing.Timing.merge([t[name] for t in per]) for name in parts[0]["timings"]}
    process_metrics = [suite.metrics_of(row["kind"], {k: v.median_us for k, v in t.items()}) for t in per]
    row = suite.finish_row(w, row, merged, _merged_metrics(process_metrics))
    row["processes"] = processes
    row["process_medians_us"] = {name: [t[name].median_us for t in per] for name in merged}
    row["process_metrics"] = process_metrics
    return row


def worker_main(w: Workload, cfg: suite.Config, first_round: int, result_path: str) -> int:
    """The worker side: measure ``w`` here and write its row and raw blocks to ``result_path``."""
    log = lambda s: print(f"[bench worker] {s}", file=sys.stderr, flush=True)  # noqa: E731
    row, t = suite.measure_workload(w, cfg, log, first_round)
    timings = {} if t is None else {name: v.as_dict(blocks=True) for name, v in t.items()}
    with open(result_path, "w") as f:
        json.dump({"row": row, "timings": timings}, f)
    return 0
