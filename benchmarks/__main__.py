"""``python -m benchmarks``: the benchmark suite (see ``--help``)."""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from . import report, suite, workers
from .machine import machine_info
from .workloads import WORKLOADS, by_name

# (worker processes per workload, rounds per process, seconds per variant per round); one
# process means this one. Many short rounds rather than a few long ones: the host's memory
# bandwidth drifts within a second, and long rounds let two variants of one process meet
# different bandwidths where short interleaved ones meet the same drift.
_FULL = (3, 10, 0.05)
_QUICK = (1, 3, 0.02)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Stock vs npu_dispatch copies: times (us), ratios, roofline efficiency, launches, targets.",
    )
    p.add_argument("--quick", action="store_true", help="short run (under a minute): sanity, not numbers to quote")
    p.add_argument("--only", metavar="NAME[,NAME]", help="comma-separated workloads (see --list)")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--out", metavar="DIR", help="write DIR/benchmarks.md, DIR/benchmarks.json and DIR/benchmarks.png")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(),
                   help="torch intra-op threads (default: torch's default here, %(default)s)")
    p.add_argument("--processes", type=_positive(int),
                   help="fresh worker processes per workload, run one after another: times are the median "
                        "of their medians, ratios the median of each process's (default 3, --quick 1: "
                        "this process)")
    p.add_argument("--rounds", type=_positive(int), help="interleaved rounds per process (default 10, --quick 3)")
    p.add_argument("--min-run-time", type=_positive(float),
                   help="seconds per variant per round (default 0.05, --quick 0.02)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--first-round", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p


def _positive(kind):
    """An argparse type: ``kind(text)``, greater than zero."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
        return value
    return parse


def run(args: argparse.Namespace) -> dict:
    """Run the selected workloads; returns the JSON-ready result."""
    processes, rounds, min_run_time = _QUICK if args.quick else _FULL
    processes = processes if args.processes is None else args.processes
    cfg = suite.Config(args.rounds or rounds, args.min_run_time or min_run_time, args.threads, quick=args.quick)
    names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    workloads = by_name(names)
    log = lambda s: print(f"[bench] {s}", file=sys.stderr, flush=True)  # noqa: E731
    # Before the workloads: the load average must be the machine's, not this run's own.
    machine = machine_info(cfg.threads)
    if machine["busy"]:
        # Said first as well as last: a busy second core can hold every two-thread call for a whole
        # scheduler quantum, and the tables then read 10 to 100 times off.
        log(_busy_warning(machine))
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        if processes == 1:
            rows = [suite.run_workload(w, cfg, log) for w in workloads]
        else:
            rows = [workers.run_in_workers(w, cfg, processes, log) for w in workloads]
    finally:
        torch.set_num_threads(before)  # run() is also called in-process (tests)
    return {
        "schema": 1,
        "machine": machine,
        "config": {"quick": args.quick, "processes": processes, "rounds": cfg.rounds,
                   "min_run_time_s": cfg.min_run_time, "threads": cfg.threads, "only": names},
        "workloads": rows,
        "all_pass": all(r.get("pass", False) for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 0 whether or not targets pass (they are reported, not asserted)."""
    args = _parser().parse_args(argv)
    if args.list:
        for w in WORKLOADS:
            print(f"{w.name:22} {w.description}")
        return 0
    if args.worker:
        (w,) = by_name([args.only])
        cfg = suite.Config(args.rounds, args.min_run_time, args.threads)
        torch.set_num_threads(cfg.threads)
        return workers.worker_main(w, cfg, args.first_round, args.result)
    try:
        result = run(args)
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "benchmarks.json"), "w") as f:
            json.dump(result, f, indent=1)
        chart = report.write_chart(result, os.path.join(args.out, "benchmarks.png"))
        if chart is None:
            print("[bench] no chart: matplotlib missing (pip install 'npu-dispatch[bench]') or nothing timed",
                  file=sys.stderr)
        report.write_markdown(result, os.path.join(args.out, "benchmarks.md"), chart)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        m = result["machine"]
        threads = f"{m['torch_threads']} torch thread{'s' if m['torch_threads'] != 1 else ''}"
        print(f"{m['cpu']}, {threads}, torch {m['torch']}, "
              f"native extension: {m['native_extension']['detail']}, load {m['load_average']}\n")
        print(report.tables(result))
    if result["machine"]["busy"]:
        print(f"[bench] {_busy_warning(result['machine'])}", file=sys.stderr)
    return 0


def _busy_warning(machine: dict) -> str:
    return (f"WARNING: load average {machine['load_average']} at start: the machine is busy, numbers are "
            "not quotable (two-thread calls can read 10 to 100x off; --threads 1 for a sanity run)")


if __name__ == "__main__":
    sys.exit(main())
