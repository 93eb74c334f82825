"""Thread-safe counters of what the fast path did: per op, per path, and fallbacks by reason."""
from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["CopyStats", "PATHS", "global_stats", "add_drain"]

# Order of rows in reports; "stock" is a whole call passed to the stock op.
PATHS = ("coalesced", "foreach", "fallback", "stock", "empty")
_FAST = frozenset({"coalesced", "foreach"})


class CopyStats:
    """Counters for intercepted copy calls.

    Per path (``PATHS``): ``calls`` (calls that used the path at least once), ``tensors`` (pairs),
    ``bytes`` (destination bytes written), ``launches`` (device launches issued). Per op:
    ``op_calls``, ``fast_calls`` (calls with at least one fast-path pair), ``fallback_calls``
    (calls with at least one pair off the fast path), ``seconds`` (host wall time in the op).
    ``fallback_reasons`` counts fallback pairs (or whole stock calls) by reason kind.
    All updates hold one lock, so one instance can be shared by threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: list = []
        self.reset()

    def reset(self) -> None:
        """Zero every counter (counts a source still holds are dropped too)."""
        self._sync()
        with self._lock:
            for name in _COUNTERS:
                setattr(self, "_" + name, collections.Counter())

    def add_source(self, drain) -> None:
        """Register ``drain(stats)``, called before every read to fold in counts kept elsewhere
        (an NpuFastCopyMode's interception kernels count in C++: csrc/mode_scope.h)."""
        self._sources.append(drain)

    def _sync(self) -> None:
        for drain in list(self._sources):
            drain(self)

    def record(self, op: str, plan: "Plan", counts: dict, seconds: float) -> None:
        """Add one executed call. ``counts`` maps path -> (tensors, bytes, launches)."""
        reasons: collections.Counter = collections.Counter()
        if plan.stock_reason is not None:
            reasons[plan.stock_reason[0]] += 1
        for i in plan.fallback:
            reasons[plan.reasons[i][0]] += 1
        self.record_counts(op, counts, reasons, seconds)

    def record_counts(self, op: str, counts: dict, reasons: dict, seconds: float) -> None:
        """``record`` without a plan: ``reasons`` maps reason kind -> fallback pairs (a whole
        stock call counts once). What the native path reports, in O(1)."""
        with self._lock:
            self._op_calls[op] += 1
            self._seconds[op] += seconds
            for path, (tensors, nbytes, launches) in counts.items():
                self._calls[path] += 1
                self._tensors[path] += tensors
                self._bytes[path] += nbytes
                self._launches[path] += launches
            if _FAST.intersection(counts):
                self._fast_calls[op] += 1
            if "fallback" in counts or "stock" in counts:
                self._fallback_calls[op] += 1
            self._fallback_reasons.update(reasons)

    def add_op_totals(self, op: str, calls: int, fast_calls: int, fallback_calls: int, seconds: float) -> None:
        """Fold in per-op totals counted elsewhere (the C++ kernels of the direct ops)."""
        with self._lock:
            self._op_calls[op] += calls
            self._fast_calls[op] += fast_calls
            self._fallback_calls[op] += fallback_calls
            self._seconds[op] += seconds

    def add_path_totals(self, paths: dict, reasons: dict) -> None:
        """Fold in per-path totals: path -> (calls, tensors, bytes, launches), and reasons."""
        with self._lock:
            for path, (calls, tensors, nbytes, launches) in paths.items():
                self._calls[path] += calls
                self._tensors[path] += tensors
                self._bytes[path] += nbytes
                self._launches[path] += launches
            self._fallback_reasons.update(reasons)

    def record_passthrough(self, op: str, kind: str) -> None:
        """A call handed to the stock op before planning (subclass, unsupported schema...)."""
        with self._lock:
            self._op_calls[op] += 1
            self._calls["stock"] += 1
            self._fallback_calls[op] += 1
            self._fallback_reasons[kind] += 1

    def as_dict(self) -> dict:
        self._sync()
        with self._lock:
            return {
                "paths": {
                    p: {
                        "calls": self._calls[p],
                        "tensors": self._tensors[p],
                        "bytes": self._bytes[p],
                        "launches": self._launches[p],
                    }
                    for p in PATHS
                },
                "ops": {
                    op: {
                        "calls": self._op_calls[op],
                        "fast_calls": self._fast_calls[op],
                        "fallback_calls": self._fallback_calls[op],
                        "seconds": self._seconds[op],
                    }
                    for op in sorted(self._op_calls)
                },
                "fallback_reasons": dict(self._fallback_reasons),
            }

    @property
    def fast_path_calls(self) -> int:
        return sum(self.fast_calls.values())

    @property
    def total_fallback_calls(self) -> int:
        return sum(self.fallback_calls.values())

    def report(self) -> str:
        """A plain-text table of the counters (per op, per path, fallback reasons)."""
        d = self.as_dict()
        out = [_table(
            ["op", "calls", "fast calls", "fallback calls", "host ms"],
            [[op, v["calls"], v["fast_calls"], v["fallback_calls"], f"{v['seconds'] * 1e3:.3f}"]
             for op, v in d["ops"].items()],
        ), ""]
        out.append(_table(
            ["path", "calls", "tensors", "bytes", "launches"],
            [[p, v["calls"], v["tensors"], v["bytes"], v["launches"]] for p, v in d["paths"].items()],
        ))
        if d["fallback_reasons"]:
            out += ["", _table(["fallback reason", "count"],
                               sorted(map(list, d["fallback_reasons"].items())))]
        return "\n".join(out)

    def __repr__(self) -> str:
        return self.report()


def _counter(name: str) -> property:
    def get(self) -> collections.Counter:
        self._sync()
        return getattr(self, "_" + name)

    return property(get, doc=f"``{name}`` counter (a ``collections.Counter``), current as of this read.")


_COUNTERS = ("calls", "tensors", "bytes", "launches", "op_calls", "fast_calls", "fallback_calls", "seconds",
             "fallback_reasons")
for _name in _COUNTERS:
    setattr(CopyStats, _name, _counter(_name))


def _table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[k]) for r in cells) for k in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


_GLOBAL = CopyStats()
# Counters kept outside Python (the native kernels of the direct ops), folded in when read.
_drains: list = []


def add_drain(fn) -> None:
    """Register ``fn(stats)``, called by ``global_stats()`` to fold in counters kept elsewhere."""
    if fn not in _drains:
        _drains.append(fn)


def global_stats() -> CopyStats:
    """Counters of the direct ops (``npu_dispatch.foreach_copy_`` ...) called outside any mode."""
    for drain in _drains:
        drain(_GLOBAL)
    return _GLOBAL
