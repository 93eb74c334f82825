"""Renders suite results: a markdown table for stdout, ``benchmarks.md`` and a log-scale bar chart."""
from __future__ import annotations

import os

from .suite import copy_floor

__all__ = ["tables", "write_markdown", "write_chart"]


def _us(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if x < 100 else f"{x:,.0f}"


def _x(x: float | None, suffix: str = "x") -> str:
    return "-" if x is None else f"{x:.2f}{suffix}"


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _unmeasured(row: dict) -> str | None:
    """``SKIP: why`` for a workload this torch cannot run, ``ERROR: what`` for one whose worker
    process failed, None for a measured row."""
    if "skipped" in row:
        return f"SKIP: {row['skipped']}"
    if "error" in row:
        return f"ERROR: {row['error']}"
    return None


def _verdict(row: dict) -> str:
    if _unmeasured(row):
        return _unmeasured(row).split(":")[0]
    failed = [c["target"] + ("" if c.get("reachable", True) else " [beyond the estimated bound]")
              for c in row["checks"] if not c["pass"]]
    if not all(row.get("bitwise_equal", {}).values()):
        failed.insert(0, "bitwise")
    return "PASS" if not failed else "FAIL (" + "; ".join(failed) + ")"


def tables(result: dict) -> str:
    """Copy table, dispatch-overhead table and per-target checks, as markdown (times in us)."""
    rows = result["workloads"]
    copy, disp, checks = [], [], []
    for r in rows:
        if _unmeasured(r):
            copy.append([r["name"]] + ["-"] * 21 + [_unmeasured(r)])
            continue
        t = {k: v["median_us"] for k, v in r["times_us"].items()}
        m = r["metrics"]
        if r["kind"] == "dispatch":
            disp.append([r["name"], _us(t["no_mode"]), _us(t["bare_mode"]), _us(t["mode"]),
                         _x(m["extra_us_vs_bare_mode"], " us"), _verdict(r)])
        else:
            paths = ", ".join(f"{k} {v}" for k, v in r["paths"].items())
            bits = "yes" if all(r["bitwise_equal"].values()) else "NO " + str(r["bitwise_equal"])
            copy.append([
                r["name"], str(r["pairs"]), f"{r['elements']:,}", _us(t["stock"]), _us(t["direct"]),
                _us(t["mode"]), _us(t.get("mode_front")), _us(t["bare_mode"]), _us(t.get("null_mode")),
                _us(t.get("null_route")), _us(t.get("null_route_copy")), _us(t["roofline"]),
                _us(copy_floor(t)),
                _x(m["speedup_direct"]), _x(m["speedup_mode"]), _x(m.get("speedup_mode_front")),
                _x(m["speedup_mode_ceiling"]) + ("" if m.get("speedup_mode_estimate") is None
                                                 else " / " + _x(m["speedup_mode_estimate"])),
                _x(m["efficiency_direct"], ""), _x(m["efficiency_mode"], ""),
                _bounds(m),
                f"{r['launches']} ({paths})", bits, _verdict(r),
            ])
        for c in r["checks"]:
            unit = " us" if c["metric"].endswith("_us") else ""
            ceiling = "-" if c.get("ceiling") is None else _x(c["ceiling"], unit) + (
                "" if c["reachable"] else " (beyond)")
            checks.append([r["name"], c["target"] + unit, _x(c["value"], unit), ceiling,
                           "PASS" if c["pass"] else "FAIL"])
    out = []
    if copy:
        out.append(_md(
            ["workload", "pairs", "elements", "stock us", "direct us", "mode us", "mode front us", "bare mode us",
             "null mode us", "null route us", "null route + copy us", "roofline us", "floor us", "stock/direct", "stock/mode",
             "stock/mode front", "mode ceiling / estimate",
             "eff direct", "eff mode", "eff bound (hot / after copy)", "launches (ours)", "bitwise = stock", "targets"],
            copy,
        ))
    if disp:
        out.append(_md(["workload", "no mode us", "bare mode us", "NpuFastCopyMode us",
                        "mode - bare", "targets"], disp))
    if checks:
        out.append(_md(["workload", "target", "measured", "bound", "result"], checks))
    return "\n\n".join(out)


def _bounds(m: dict) -> str:
    hot, after = m.get("efficiency_bound_hot"), m.get("efficiency_bound_after_copy")
    if hot is None and after is None:
        return "-"
    return f"{_x(hot, '')} / {_x(after, '')}"


def _machine(result: dict) -> str:
    m, c = result["machine"], result["config"]
    native = m["native_extension"]
    rows = [
        ["date", m["date"]],
        ["CPU", f"{m['cpu']} ({m['logical_cpus']} logical CPUs)"],
        ["torch threads", str(m["torch_threads"])],
        ["load average at start", str(m["load_average"]) + (" (BUSY: numbers not quotable)" if m["busy"] else "")],
        ["torch", m["torch"]],
        ["python", m["python"]],
        ["platform", m["platform"]],
        ["native extension", native["detail"]],
        ["timing", _method(c)],
    ]
    return _md(["", ""], rows)


def _method(c: dict) -> str:
    timer = f"x {c['min_run_time_s']} s per variant, torch.utils.benchmark.Timer.blocked_autorange"
    if c.get("processes", 1) > 1:
        return (f"{c['processes']} fresh worker processes per workload x {c['rounds']} interleaved rounds "
                f"{timer}; times: the median of the processes' medians of their blocks; ratios and "
                "efficiencies: the median of each process's own")
    return f"{c['rounds']} interleaved rounds {timer}, median of all blocks"


def rounds_table(result: dict) -> str:
    """Per-round medians (us) of the direct op, the roofline and an empty parallel region: a VM's
    drift shows as rounds that step together between levels; with worker processes, ``|``
    separates the processes (each its own memory layout)."""
    rows = []
    per = result["config"]["rounds"] if result["config"].get("processes", 1) > 1 else None
    for r in result["workloads"]:
        t = r.get("times_us", {})
        if "parallel_region" not in t:
            continue
        for name in ("direct", "roofline", "parallel_region"):
            xs = [f"{x:.3g}" for x in t[name]["round_medians_us"]]
            groups = [xs[k:k + per] for k in range(0, len(xs), per)] if per else [xs]
            rows.append([r["name"], name.replace("_", " "), " \\| ".join(", ".join(g) for g in groups)])
    return _md(["workload", "variant", "median of each round (us)"], rows) if rows else ""


def write_markdown(result: dict, path: str, chart: str | None) -> None:
    """Write ``path`` (``benchmarks.md``): results, checks, machine, method and workloads."""
    parts = [
        "# npu_dispatch benchmarks",
        "Generated by `python -m npu_dispatch.bench --out docs/`. Times are median microseconds per "
        "call. *stock*: the stock op; *direct*: `npu_dispatch.foreach_copy_` / "
        "`npu_dispatch.all_gather_copy_in`; *mode*: the stock call under `NpuFastCopyMode`; "
        "*mode front*: the same under `NpuFastCopyMode(front=True)`, whose torch-function front "
        "copies plain lists before dispatch (foreach lists only; a compiled function recompiles "
        "once per mode state under it); "
        "*bare mode*: the stock call under a do-nothing `TorchDispatchMode` (the floor of any dispatch "
        "mode: the dispatcher boxes every tensor of the lists into Python); *null mode*: the stock "
        "call delivered to a dispatch mode that returns without doing anything (the floor of a mode "
        "that handles the op in Python); *null route*: the stock call taken by this library's "
        "native dispatch route (csrc/mode_route.h, how `NpuFastCopyMode` copies plain lists) and "
        "then not copied (the floor of a mode that handles it below the Python binding); *null route "
        "+ copy*: the same, the route moving as many bytes as one flat copy between the roofline's "
        "buffers instead, as it copies a call's bytes (no per-pair work; an estimate, not a bound, "
        "of a routed call that copies: its bytes meet the caches differently); *mode ceiling*: stock / the faster of the null "
        "mode and the null route, the best speed-up a dispatch mode can reach; *estimate*: stock / "
        "(null route + copy + the per-pair work timed alone), an estimate of the best a dispatch mode "
        "that copies exactly reaches; "
        "*roofline*: one flat `copy_` of as many elements with the same dtypes between two contiguous "
        "buffers; *floor*: the faster of the roofline and this library's kernel on the same flat "
        "buffers, followed in the same timed statement by only the per-pair work any exact foreach "
        "copy repeats beyond the bytes (read each tensor's address and size, bump each "
        "destination's version counter, as stock does), its fixed call cost taken off. eff = "
        "roofline / ours; eff bound: two estimates, from measurements, of the best efficiency an "
        "exact foreach copy reaches here: roofline / (fastest flat copy + that per-pair work timed "
        "alone, metadata hot in cache), and roofline / floor (the per-pair work right after the "
        "copy, as a real call meets it). Estimates, not proofs. bound (checks): the higher of the "
        "two for efficiency targets, the mode ceiling for targets through the mode (the estimate "
        "is not read: a mode has come in under the null route + copy). Launches: from `NpuFastCopyMode.stats` for one call "
        "(stock on CPU issues one `copy_` per pair).",
        tables(result),
    ]
    if chart:
        parts.append(f"![stock vs direct vs mode vs roofline]({os.path.basename(chart)})")
    rounds = rounds_table(result)
    if rounds:
        parts += ["## Rounds", "Each round times every variant once, in a rotated order. *parallel region*: "
                  "one empty parallel region on every torch thread (`region_probe`, "
                  "csrc/python_entry.cpp), what starting and joining the threads cost in that round. "
                  "With worker processes, `|` separates them: each process builds the workload anew, "
                  "so its tensors sit elsewhere in memory (npu_dispatch/bench/workers.py).",
                  rounds]
    parts += ["## Machine", _machine(result), "## Workloads",
              "\n".join(f"- `{r['name']}`: {r['description']}" for r in result["workloads"])]
    with open(path, "w") as f:
        f.write("\n\n".join(parts) + "\n")


_SERIES = (  # (label, variant name per kind)
    ("stock / no mode", {"copy": "stock", "dispatch": "no_mode"}),
    ("direct op", {"copy": "direct"}),
    ("stock under NpuFastCopyMode", {"copy": "mode", "dispatch": "mode"}),
    ("stock under NpuFastCopyMode(front=True)", {"copy": "mode_front"}),
    ("roofline (one flat copy_)", {"copy": "roofline"}),
    ("bare pass-through mode", {"copy": "bare_mode", "dispatch": "bare_mode"}),
    ("null mode (delivery to Python only)", {"copy": "null_mode"}),
    ("null route (delivery to the native route only)", {"copy": "null_route"}),
    ("null route + one flat copy of the bytes", {"copy": "null_route_copy"}),
    ("per-pair work alone (no copy)", {"copy": "pair_floor"}),
)


def write_chart(result: dict, path: str) -> str | None:
    """Write a log-scale grouped bar chart to ``path`` (PNG); None if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in result["workloads"] if not _unmeasured(r)]
    width = 0.8 / len(_SERIES)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(rows)), 4.5))
    for k, (label, names) in enumerate(_SERIES):
        xs, ys = [], []
        for i, r in enumerate(rows):
            v = names.get("dispatch" if r["kind"] == "dispatch" else "copy")
            if v is not None and v in r["times_us"]:
                xs.append(i - 0.4 + (k + 0.5) * width)
                ys.append(r["times_us"][v]["median_us"])
        if xs:
            ax.bar(xs, ys, width, label=label)
    ax.set_yscale("log")
    ax.set_ylabel("median time per call (us, log scale)")
    ax.set_xticks(range(len(rows)), [r["name"] for r in rows], rotation=20, ha="right")
    m = result["machine"]
    ax.set_title(f"npu_dispatch, {m['cpu']}, {m['torch_threads']} threads, torch {m['torch']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
