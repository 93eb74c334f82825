"""Renders suite results: markdown tables for stdout, ``benchmarks.md`` and a log-scale bar chart."""
from __future__ import annotations

import os

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
    failed = [c["target"] for c in row["checks"] if not c["pass"]]
    if not all(row.get("bitwise_equal", {}).values()):
        failed.insert(0, "bitwise")
    return "PASS" if not failed else "FAIL (" + "; ".join(failed) + ")"


def tables(result: dict) -> str:
    """Copy table, mode-overhead table, FSDP step table, unmeasured rows and per-target checks, as
    markdown (times in us, step times in ms)."""
    copy, disp, steps, missing, checks = [], [], [], [], []
    for r in result["workloads"]:
        if _unmeasured(r):
            missing.append([r["name"], _unmeasured(r)])
            continue
        m = r["metrics"]
        if r["kind"] == "example":
            steps.append([
                r["name"], f"{r['timed_steps']} of {r['steps']}", _ms(m["step_seconds_stock"]),
                _ms(m["step_seconds_fast"]), _x(m["step_speedup"]),
                f"{m['copy_ms_stock']:.2f} / {m['copy_ms_fast']:.2f}", _pct(m["copy_share_stock"]),
                ", ".join("yes" if m[k] else "NO" for k in
                          ("bitwise_equal", "grads_equal_every_step", "params_equal_every_step")),
                _verdict(r),
            ])
        elif r["kind"] == "dispatch":
            t = {k: v["median_us"] for k, v in r["times_us"].items()}
            disp.append([r["name"], _us(t["no_mode"]), _us(t["mode"]), _us(t["debug_mode"]),
                         _x(m["extra_us_vs_no_mode"], " us"), _x(m["debug_extra_us_vs_no_mode"], " us"),
                         _verdict(r)])
        else:
            t = {k: v["median_us"] for k, v in r["times_us"].items()}
            paths = ", ".join(f"{k} {v}" for k, v in r["paths"].items())
            bits = "yes" if all(r["bitwise_equal"].values()) else "NO " + str(r["bitwise_equal"])
            copy.append([
                r["name"], str(r["pairs"]), f"{r['elements']:,}", _us(t["stock"]), _us(t["direct"]),
                _us(t["mode"]), _us(t["roofline"]),
                _x(m["speedup_direct"]), _x(m["speedup_mode"]),
                _x(m["mode_vs_bound"], ""), _x(m["efficiency_direct"], ""),
                f"{r['launches']} ({paths})", bits, _verdict(r),
            ])
        for c in r["checks"]:
            unit = " us" if c["metric"].endswith("_us") else ""
            checks.append([r["name"], c["target"] + unit, _x(c["value"], unit), "PASS" if c["pass"] else "FAIL"])
    out = []
    if copy:
        out.append(_md(
            ["workload", "pairs", "elements", "stock us", "direct us", "mode us", "roofline us",
             "stock/direct", "stock/mode", "mode / bound", "eff direct", "launches (ours)",
             "bitwise = stock", "targets"],
            copy,
        ))
    if disp:
        out.append(_md(["workload", "no mode us", "NpuFastCopyMode() us", "NpuFastCopyMode(strict=True) us",
                        "mode - no mode", "debug mode - no mode", "targets"], disp))
    if steps:
        out.append(_md(["workload", "timed steps", "stock step ms", "mode step ms", "stock/mode",
                        "copy ms stock / mode", "copy share of stock step", "losses, grads, params equal",
                        "targets"], steps))
    if missing:
        out.append(_md(["workload", "not measured"], missing))
    if checks:
        out.append(_md(["workload", "target", "measured", "result"], checks))
    return "\n\n".join(out)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


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


_LEGEND = (
    "Generated by `python -m benchmarks --out docs/`. Times are median microseconds per call. "
    "*stock*: the stock op with no mode; *direct*: `npu_dispatch.foreach_copy_` / "
    "`npu_dispatch.all_gather_copy_in`; *mode*: the stock call inside `NpuFastCopyMode()`; "
    "*roofline*: one flat `copy_` of as many elements, same dtypes, between two contiguous buffers. "
    "*mode / bound*: stock/mode over stock/direct; *eff direct*: roofline / direct. Launches: from `NpuFastCopyMode.stats` for "
    "one call (stock on CPU issues one `copy_` per pair). *mode_overhead*: an op the mode does not own, "
    "with no mode, inside `NpuFastCopyMode()` and inside the debugging `NpuFastCopyMode(strict=True)` "
    "(a Python dispatch mode). *fsdp_step*: one run of `examples/fsdp_train.py` (2 gloo ranks), stock "
    "steps and steps under the mode interleaved, medians after the warm-up steps; copy ms: host time "
    "of `aten::_foreach_copy_` + `fsdp::all_gather_copy_in` (profiler totals, children included; a "
    "copy op inside another counts once) in one profiled step of each."
)


def write_markdown(result: dict, path: str, chart: str | None) -> None:
    """Write ``path`` (``benchmarks.md``): results, checks, machine, method and workloads."""
    parts = ["# npu_dispatch benchmarks", _LEGEND, tables(result)]
    if chart:
        parts.append(f"![stock vs direct vs mode vs roofline]({os.path.basename(chart)})")
    parts += ["## Machine", _machine(result), "## Workloads",
              "\n".join(f"- `{r['name']}`: {r['description']}" for r in result["workloads"])]
    # benchmarks/compiled_buckets.py keeps its own marked section in the same file: carried over.
    old = open(path).read() if os.path.exists(path) else ""
    begin, end = "<!-- compiled_buckets: begin -->", "<!-- compiled_buckets: end -->"
    if begin in old and end in old:
        parts.append(old[old.index(begin): old.index(end) + len(end)])
    with open(path, "w") as f:
        f.write("\n\n".join(parts) + "\n")


_SERIES = (  # (label, variant name per kind)
    ("stock / no mode", {"copy": "stock", "dispatch": "no_mode"}),
    ("direct op", {"copy": "direct"}),
    ("inside NpuFastCopyMode()", {"copy": "mode", "dispatch": "mode"}),
    ("roofline (one flat copy_)", {"copy": "roofline"}),
    ("inside NpuFastCopyMode(strict=True)", {"dispatch": "debug_mode"}),
)


def write_chart(result: dict, path: str) -> str | None:
    """Write a log-scale grouped bar chart of the timed workloads to ``path`` (PNG); None if
    matplotlib is missing or nothing was timed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in result["workloads"] if not _unmeasured(r) and "times_us" in r]
    if not rows:
        return None
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
