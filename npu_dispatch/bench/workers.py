"""Each workload in fresh worker processes, their timings merged (``--processes``).

Where a workload's tensors land in memory moves its small-copy timings: ``small_many``'s direct
op read 9.6 to 11.2 us in five fresh processes and 12.3 to 17.5 us in four that had run
``tiny_many`` first (its 400 tensors then fill the holes ``tiny_many`` left; docs/profile.md). A single process measures one such layout, chosen by the workloads before it.
So, as pyperf does, the suite runs each workload in several fresh processes, one after another
(never at once: they would share the cores), and reports the median of the processes' medians
(``timing.Timing.merge``); the rows keep each process's median.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Callable

from . import suite, timing
from .workloads import Workload

__all__ = ["run_in_workers", "worker_main"]


def run_in_workers(w: Workload, cfg: suite.Config, processes: int,
                   log: Callable[[str], None] = lambda s: None) -> dict:
    """Measure ``w`` in ``processes`` fresh processes, ``cfg.rounds`` rounds each (continuing the
    rotation of variants), and return its row from the merged timings.

    Raises:
        RuntimeError: a worker exited with an error (its stderr has already reached ours).
    """
    parts = []
    for p in range(processes):
        log(f"{w.name}: worker process {p + 1} of {processes}")
        cmd = [sys.executable, "-m", "npu_dispatch.bench", "--worker", "--only", w.name,
               "--rounds", str(cfg.rounds), "--min-run-time", repr(cfg.min_run_time),
               "--threads", str(cfg.threads), "--first-round", str(p * cfg.rounds)]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"benchmark worker for {w.name} exited with {out.returncode}")
        parts.append(json.loads(out.stdout))
    rows = [p["row"] for p in parts]
    if any("skipped" in r for r in rows):
        return next(r for r in rows if "skipped" in r)
    row = rows[0]
    if "bitwise_equal" in row:
        row["bitwise_equal"] = {k: all(r["bitwise_equal"][k] for r in rows) for k in row["bitwise_equal"]}
    timings = {name: timing.Timing.merge([timing.Timing(**p["timings"][name]) for p in parts])
               for name in parts[0]["timings"]}
    row = suite.finish_row(w, row, timings)
    row["processes"] = processes
    row["process_medians_us"] = {name: [p["timings"][name]["median_us"] for p in parts] for name in timings}
    return row


def worker_main(w: Workload, cfg: suite.Config, first_round: int) -> int:
    """The worker side: measure ``w`` here and print one JSON object (row and raw blocks)."""
    log = lambda s: print(f"[bench worker] {s}", file=sys.stderr, flush=True)  # noqa: E731
    row, t = suite.measure_workload(w, cfg, log, first_round)
    timings = {} if t is None else {name: v.as_dict(blocks=True) for name, v in t.items()}
    print(json.dumps({"row": row, "timings": timings}))
    return 0
