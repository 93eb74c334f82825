"""Thread-safe counters of what the fast path did, per op: calls, and per path and per fallback
reason the pairs, bytes and launches."""
from __future__ import annotations

import collections
import threading

__all__ = ["CopyStats", "paths", "global_stats", "add_drain"]

# The paths a pair can take, in report order: the C++ core defines them (csrc/planner/execute.h,
# which also decides whether a call was fast or a fallback) and they are set here when it loads
# (_native). Its
# paths: "coalesced" (adjacent pairs as one flat copy), "foreach" (the device's batched kernel),
# "fallback" (pairs copied by stock's copy_), "stock" (a whole call handed to the stock op),
# "empty" (zero-element pairs), "staged" (cross-dtype pairs through scratch memory). Without it,
# every call is handed to stock whole: "stock" is then the only path.
_order: tuple | None = None  # None: not asked for yet
_source = None  # set by _native: loads the library, which calls set_paths


def set_paths(order) -> None:
    """The C++ core's paths, in report order."""
    global _order
    _order = tuple(order)


def set_path_source(load) -> None:
    """``load()``: loads the C++ core (which calls :func:`set_paths`), the first time paths are asked for."""
    global _source
    _source = load


def paths() -> tuple:
    """The paths a pair can take, in report order (loads the native library the first time)."""
    return _path_order()


def _path_order() -> tuple:
    global _order
    if _order is None and _source is not None:
        _source()
    if _order is None:
        _order = ("stock",)
    return _order


class _Op:
    """One op's counters."""

    __slots__ = ("calls", "fast_calls", "fallback_calls", "seconds", "paths", "fallbacks")

    def __init__(self) -> None:
        self.calls = self.fast_calls = self.fallback_calls = 0
        self.seconds = 0.0
        self.paths: dict[str, list[int]] = {}  # path -> calls, pairs, bytes, launches
        self.fallbacks: dict[str, list[int]] = {}  # reason -> [pairs, calls]


class CopyStats:
    """Counters for intercepted copy calls, kept per op.

    Per op: ``calls``, ``fast_calls`` (calls with at least one pair on the fast path),
    ``fallback_calls`` (calls with at least one pair off it), ``seconds`` (host wall time in the
    op); per path (:func:`paths`): ``calls`` (calls that used it), ``pairs`` (the copies the path
    made: a foreach copy's tensor pairs; a served FSDP copy's pieces (rows of the copy-out, chunks
    of chunk_cat), a stock one's tensors), ``bytes`` (bytes of the tensors written; for a call handed
    to stock whole, as csrc/dispatch/intercept.h ``whole_call_counts`` counts them), ``launches``
    (device launches issued); per fallback
    reason: ``pairs`` that left the fast path for it (a whole call handed to stock: all its pairs)
    and ``calls`` in which it did. Totals over ops are the sums of the per-op rows.

    All updates hold one lock, so one instance can be shared by threads. Counts kept in C++ (an
    ``NpuFastCopyMode``'s interception kernels, the direct ops) are folded in before every read.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: list = []
        self._ops: dict[str, _Op] = {}

    def reset(self) -> None:
        """Zero every counter (counts a source still holds are dropped too)."""
        self._sync()
        with self._lock:
            self._ops = {}

    def add_source(self, drain) -> None:
        """Register ``drain(stats)``, called before every read to fold in counts kept elsewhere
        (an NpuFastCopyMode's interception kernels count in C++: csrc/dispatch/mode_scope.h)."""
        self._sources.append(drain)

    def _sync(self) -> None:
        for drain in list(self._sources):
            drain(self)

    def _op(self, op: str) -> _Op:
        o = self._ops.get(op)
        if o is None:
            o = self._ops[op] = _Op()
        return o

    def record_counts(self, op: str, counts: dict, reasons: dict, seconds: float, fast: bool, fallback: bool) -> None:
        """Add one executed call. ``counts`` maps path -> (pairs, bytes, launches); ``reasons``
        maps reason -> pairs that left the fast path for it; ``fast`` / ``fallback``: whether
        some pair took a fast path / left it (the C++ core's ``CallResult``, csrc/planner/execute.h)."""
        with self._lock:
            o = self._op(op)
            o.calls += 1
            o.seconds += seconds
            for path, (pairs, nbytes, launches) in counts.items():
                row = o.paths.setdefault(path, [0, 0, 0, 0])
                row[0] += 1
                row[1] += pairs
                row[2] += nbytes
                row[3] += launches
            o.fast_calls += fast
            o.fallback_calls += fallback
            for kind, pairs in reasons.items():
                row = o.fallbacks.setdefault(kind, [0, 0])
                row[0] += pairs
                row[1] += 1

    def record_no_native(self, op: str, pairs: int) -> None:
        """A call handed to the stock op whole because the native library is missing, counted as
        the library counts every such call (csrc/planner/execute.h ``stock_counts``: one launch a
        pair, a call of no pairs counting one), except its bytes, which only the library measures."""
        pairs = max(pairs, 1)
        self.record_counts(op, {"stock": (pairs, 0, pairs)}, {"no_native": pairs}, 0.0, fast=False, fallback=True)

    def add_totals(self, op: str, calls: int, fast_calls: int, fallback_calls: int, seconds: float,
                   paths: dict, fallbacks: dict) -> None:
        """Fold in one op's totals counted elsewhere: ``paths`` maps path -> (calls, pairs,
        bytes, launches), ``fallbacks`` reason -> (pairs, calls)."""
        with self._lock:
            o = self._op(op)
            o.calls += calls
            o.fast_calls += fast_calls
            o.fallback_calls += fallback_calls
            o.seconds += seconds
            for path, values in paths.items():
                row = o.paths.setdefault(path, [0, 0, 0, 0])
                for k, v in enumerate(values):
                    row[k] += v
            for kind, (pairs, n) in fallbacks.items():
                row = o.fallbacks.setdefault(kind, [0, 0])
                row[0] += pairs
                row[1] += n

    def as_dict(self) -> dict:
        """The same data as :meth:`report`: ``ops`` (per op: calls, fast_calls, fallback_calls,
        seconds, ``paths`` and ``fallbacks``), and their totals over ops: ``paths`` (path ->
        calls, pairs, bytes, launches; ``tensors`` is ``pairs``), ``fallback_reasons`` (reason ->
        pairs) and ``fallbacks`` (reason -> pairs, calls)."""
        self._sync()
        with self._lock:
            ops = {}
            known = _path_order()
            order = known + tuple(sorted({p for o in self._ops.values() for p in o.paths} - set(known)))
            paths = {p: {"calls": 0, "pairs": 0, "tensors": 0, "bytes": 0, "launches": 0} for p in order}
            fallbacks: dict[str, dict] = {}
            for name in sorted(self._ops):
                o = self._ops[name]
                op_paths = {p: {"calls": c, "pairs": n, "bytes": b, "launches": la}
                            for p, (c, n, b, la) in o.paths.items() if c}
                ops[name] = {"calls": o.calls, "fast_calls": o.fast_calls, "fallback_calls": o.fallback_calls,
                             "seconds": o.seconds, "paths": op_paths,
                             "fallbacks": {k: {"pairs": v[0], "calls": v[1]} for k, v in sorted(o.fallbacks.items())}}
                for p, row in op_paths.items():
                    for k in ("calls", "pairs", "bytes", "launches"):
                        paths[p][k] += row[k]
                    paths[p]["tensors"] = paths[p]["pairs"]
                for k, (pairs, n) in o.fallbacks.items():
                    total = fallbacks.setdefault(k, {"pairs": 0, "calls": 0})
                    total["pairs"] += pairs
                    total["calls"] += n
            return {"ops": ops, "paths": paths, "fallback_reasons": {k: v["pairs"] for k, v in fallbacks.items()},
                    "fallbacks": fallbacks}

    @property
    def fallback_reasons(self) -> collections.Counter:
        """Pairs that left the fast path, per reason, over ops."""
        return collections.Counter(self.as_dict()["fallback_reasons"])

    @property
    def fast_path_calls(self) -> int:
        return sum(self.fast_calls.values())

    @property
    def total_fallback_calls(self) -> int:
        return sum(self.fallback_calls.values())

    def report(self) -> str:
        """Plain-text tables: per op and path (calls, pairs, bytes, launches) with each op's
        calls and host time, a total row per column; then fallbacks per reason, in pairs and
        calls."""
        d = self.as_dict()
        rows = []
        for op, v in d["ops"].items():
            rows.append([op, "(all paths)", v["calls"], "", "", "", f"{v['seconds'] * 1e3:.3f}"])
            for p in d["paths"]:
                if p in v["paths"]:
                    r = v["paths"][p]
                    rows.append(["", p, r["calls"], r["pairs"], r["bytes"], r["launches"], ""])
        total = d["paths"]
        rows.append(["total", "(all paths)", sum(v["calls"] for v in d["ops"].values()),
                     sum(r["pairs"] for r in total.values()), sum(r["bytes"] for r in total.values()),
                     sum(r["launches"] for r in total.values()),
                     f"{sum(v['seconds'] for v in d['ops'].values()) * 1e3:.3f}"])
        out = [_table(["op", "path", "calls", "pairs", "bytes", "launches", "host ms"], rows)]
        if d["fallbacks"]:
            out += ["", _table(["fallback reason", "pairs", "calls"],
                               [[k, v["pairs"], v["calls"]] for k, v in sorted(d["fallbacks"].items())])]
        else:
            out += ["", "no fallbacks: every pair took the fast path"]
        return "\n".join(out)

    def __repr__(self) -> str:
        return self.report()


def _by_op(field: str, doc: str) -> property:
    def get(self) -> collections.Counter:
        return collections.Counter({op: v[field] for op, v in self.as_dict()["ops"].items()})

    return property(get, doc=doc)


def _by_path(field: str, doc: str) -> property:
    def get(self) -> collections.Counter:
        return collections.Counter({p: v[field] for p, v in self.as_dict()["paths"].items() if v[field]})

    return property(get, doc=doc)


CopyStats.op_calls = _by_op("calls", "Calls per op.")
CopyStats.fast_calls = _by_op("fast_calls", "Calls per op with at least one pair on the fast path.")
CopyStats.fallback_calls = _by_op("fallback_calls", "Calls per op with at least one pair off the fast path.")
CopyStats.seconds = _by_op("seconds", "Host seconds per op.")
CopyStats.calls = _by_path("calls", "Calls per path, over ops.")
CopyStats.tensors = CopyStats.pairs = _by_path("pairs", "Pairs per path, over ops.")
CopyStats.bytes = _by_path("bytes", "Destination bytes per path, over ops.")
CopyStats.launches = _by_path("launches", "Device launches per path, over ops.")


def _table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[k]) for r in cells) for k in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) if k < 2 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


_GLOBAL = CopyStats()
# Counters kept outside Python (the native kernels of the direct ops), folded in when read.
_drains: list = []


def add_drain(fn) -> None:
    """Register ``fn(stats)``, called by ``global_stats()`` to fold in counters kept elsewhere."""
    if fn not in _drains:
        _drains.append(fn)


_local = threading.local()  # .modes: the NpuFastCopyModes entered on this thread, innermost last


def entered() -> list:
    """The NpuFastCopyModes entered on this thread, innermost last (the mode keeps it)."""
    modes = getattr(_local, "modes", None)
    if modes is None:
        modes = _local.modes = []
    return modes


def current() -> CopyStats:
    """The stats of the innermost NpuFastCopyMode this thread entered, else the global ones (as the
    C++ kernels count: csrc/dispatch/mode_scope.h record_call)."""
    modes = entered()
    return modes[-1].stats if modes else _GLOBAL


def global_stats() -> CopyStats:
    """Counters of the direct ops (``npu_dispatch.foreach_copy_`` ...) called outside any mode."""
    for drain in _drains:
        drain(_GLOBAL)
    return _GLOBAL
