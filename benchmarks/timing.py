"""Interleaved timing with ``torch.utils.benchmark.Timer``: every variant of a workload is timed in
each round, in a rotated order, so machine drift hits all of them alike.
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
from typing import Any, Callable, ContextManager

from torch.utils.benchmark import Timer

__all__ = ["Variant", "Timing", "interleaved"]


@dataclasses.dataclass
class Variant:
    """One way to run a workload: ``stmt`` evaluated in ``globals``, inside ``context()``.

    The context (a dispatch mode, say) is entered once around a whole measurement, as a user
    enters a mode once around a training loop, so its enter/exit cost is not counted per call.
    """

    name: str
    stmt: str
    globals: dict[str, Any]
    context: Callable[[], ContextManager] = contextlib.nullcontext

    def run_once(self) -> None:
        """One call, outside the timer (warm-up, correctness checks)."""
        with self.context():
            exec(self.stmt, self.globals)


@dataclasses.dataclass
class Timing:
    """Per-call wall time of one variant, in microseconds.

    ``median_us`` and ``iqr_us`` are over every block of every round (a block's time divided by
    its calls), or for a :meth:`merge` the median of the processes' medians; ``round_medians_us``
    shows drift between rounds; ``block_us`` holds the blocks (kept out of :meth:`as_dict`).
    """

    median_us: float
    iqr_us: float
    blocks: int
    round_medians_us: list[float]
    block_us: list[float] = dataclasses.field(default_factory=list, repr=False)

    @classmethod
    def of(cls, block_us: list[float], round_medians_us: list[float]) -> "Timing":
        """Median and interquartile range over ``block_us`` (at least one block)."""
        us = sorted(block_us)
        q = statistics.quantiles(us, n=4) if len(us) > 1 else [us[0]] * 3
        return cls(statistics.median(us), q[2] - q[0], len(us), list(round_medians_us), us)

    @classmethod
    def merge(cls, parts: list["Timing"]) -> "Timing":
        """One timing of ``parts`` (runs of one variant in several processes): the median of their
        medians, so each process weighs alike whatever block count ``blocked_autorange`` chose in
        it; the interquartile range and block count over every block of every part."""
        t = cls.of([b for p in parts for b in p.block_us], [r for p in parts for r in p.round_medians_us])
        t.median_us = statistics.median(p.median_us for p in parts)
        return t

    def as_dict(self, blocks: bool = False) -> dict:
        d = dataclasses.asdict(self)
        if not blocks:
            del d["block_us"]
        return d


def interleaved(
    variants: list[Variant], *, rounds: int, min_run_time: float, threads: int, first_round: int = 0
) -> dict[str, Timing]:
    """Time each variant with ``Timer.blocked_autorange`` once per round, rotating the order.

    Args:
        variants: what to time; names must be unique.
        rounds: rounds (>= 1); round r starts with variant ``r % len(variants)``.
        min_run_time: seconds each variant runs per round.
        threads: torch intra-op threads during measurement (``Timer(num_threads=...)``).
        first_round: the number of the first round (a worker process continues the rotation).
    """
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    per_round: dict[str, list[float]] = {v.name: [] for v in variants}
    for r in range(first_round, first_round + rounds):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            timer = Timer(stmt=v.stmt, globals=v.globals, num_threads=threads, description=v.name)
            with v.context():
                m = timer.blocked_autorange(min_run_time=min_run_time)
            times[v.name].extend(m.times)
            per_round[v.name].append(m.median * 1e6)
    return {name: Timing.of([t * 1e6 for t in ts], per_round[name]) for name, ts in times.items()}
