"""Benchmark ``compiled_copy_in``: FSDP2's copy-in graph, eager stock vs Inductor vs our lowerings.

The graph (issue 4): N fp32 parameter shards ``_foreach_copy_``'d into ``torch.split`` views of one
bf16 flat buffer, then ``fsdp.all_gather_copy_in`` of those views into a bf16 all-gather output at
rank 3 of 8. Variants, all in one run on the same inputs:

- ``eager stock``: the graph run eagerly (stock ATen / FSDP kernels);
- ``inductor (default)``: ``torch.compile``, stock lowerings (Python fallback for the copy-in);
- ``fused`` / ``native``: ``npu_dispatch.lowerings`` strategies through ``make_backend``.

Times are medians of ``torch.utils.benchmark`` (``blocked_autorange``); compile time is the first
call after ``torch._dynamo.reset()`` with a fresh Inductor cache (cold: tracing, lowering, C++
build). Every compiled variant is checked bitwise against eager first.

    python benchmarks/compiled_copy_in.py            # 200 shards; writes docs/compiled_copy_in.{md,png}
    python benchmarks/compiled_copy_in.py --quick    # 40 shards, short timing, printed only (--out DIR to keep)
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import torch
import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  defines fsdp::
from torch._inductor.utils import fresh_cache
from torch.utils.benchmark import Timer

import npu_dispatch.lowerings as ndl
from npu_dispatch.lowerings.backend import make_backend

WORLD, RANK = 8, 3
DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs")


def graph(sizes):
    numel = sum(sizes)

    def copy_in(shards, out):
        flat = torch.empty(numel, dtype=torch.bfloat16)
        splits = torch.split(flat, sizes)
        torch._foreach_copy_(splits, shards)
        return torch.ops.fsdp.all_gather_copy_in(splits, out, sizes, numel, RANK)

    return copy_in, numel


def measure(fn, shards, out, min_run_time):
    t = Timer("fn(shards, out)", globals={"fn": fn, "shards": shards, "out": out})
    return t.blocked_autorange(min_run_time=min_run_time).median


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="40 shards and short timing (sanity run)")
    p.add_argument("--shards", type=int, default=None)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--out", default=None,
                   help="folder for compiled_copy_in.md / .png (default: docs/; none with --quick)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    n = args.shards or (40 if args.quick else 200)
    min_run_time = 0.3 if args.quick else 2.0
    sizes = [256 + 7 * (i % 13) for i in range(n)]  # uneven, ~300 elements each
    f, numel = graph(sizes)
    gen = torch.Generator().manual_seed(0)
    shards = [torch.randn(s, generator=gen) for s in sizes]
    ref = torch.zeros(WORLD * numel, dtype=torch.bfloat16)
    f(shards, ref)

    assert not ndl.is_registered(), "the default-Inductor variant needs stock lowerings"
    variants = {"eager stock": (None, f), "inductor (default)": ("inductor", None),
                "fused": (make_backend("fused"), None), "native": (make_backend("native"), None)}
    rows = []
    for name, (backend, fn) in variants.items():
        compile_s = None
        if fn is None:
            torch._dynamo.reset()
            fn = torch.compile(f, backend=backend)
            out = torch.zeros(WORLD * numel, dtype=torch.bfloat16)
            with fresh_cache():
                start = time.perf_counter()
                fn(shards, out)
                compile_s = time.perf_counter() - start
            assert torch.equal(out.view(torch.int16), ref.view(torch.int16)), f"{name} differs from eager"
        out = torch.zeros(WORLD * numel, dtype=torch.bfloat16)
        rows.append((name, measure(fn, shards, out, min_run_time), compile_s))
        print(f"{name:>20}: {rows[-1][1] * 1e6:9.1f} us" + (f"  (compile {compile_s:.1f} s)" if compile_s else ""))
    write(rows, n, numel, args)


def write(rows, n, numel, args):
    t = {name: sec for name, sec, _ in rows}
    best = min(t["fused"], t["native"])
    vs_inductor, vs_eager = t["inductor (default)"] / best, t["eager stock"] / best
    lines = [
        "# compiled_copy_in",
        "",
        f"FSDP2 copy-in graph: {n} fp32 shards (~{numel // n} elements each, {numel} in all) cast into "
        f"split views of one bf16 flat buffer, then `fsdp.all_gather_copy_in` at rank {RANK} of {WORLD}. "
        "Medians of `torch.utils.benchmark`; compile = first call, fresh cache.",
        "",
        f"Machine: {platform.machine()}, {torch.get_num_threads()} thread(s), torch {torch.__version__}, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}{', --quick' if args.quick else ''}.",
        "",
        "| variant | median (us) | vs eager stock | compile (s) |",
        "|---|---:|---:|---:|",
    ]
    for name, sec, comp in rows:
        lines.append(f"| {name} | {sec * 1e6:.1f} | {t['eager stock'] / sec:.2f}x | "
                     f"{'-' if comp is None else f'{comp:.1f}'} |")
    lines += [
        "",
        f"Targets (best of ours = {best * 1e6:.1f} us): >= 10x faster than default Inductor: "
        f"{vs_inductor:.1f}x {'PASS' if vs_inductor >= 10 else 'FAIL'}; >= 2x faster than eager stock: "
        f"{vs_eager:.2f}x {'PASS' if vs_eager >= 2 else 'FAIL'}."
        + (" (--quick: the targets are stated for the full 200-shard run.)" if args.quick else ""),
        "",
    ]
    print("\n".join(lines))
    # A quick sanity run leaves the kept figures alone unless asked.
    out = args.out or (None if args.quick else DOCS)
    if out is None:
        return
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "compiled_copy_in.md"), "w") as fh:
        fh.write("\n".join(lines))
    plot(rows, os.path.join(out, "compiled_copy_in.png"), n)


def plot(rows, path, n):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install matplotlib): no chart")
        return
    names = [r[0] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.bar(names, [r[1] * 1e6 for r in rows], color=["grey", "tab:red", "tab:green", "tab:blue"])
    a.set_yscale("log")
    a.set_ylabel("median time per call (us, log)")
    a.set_title(f"FSDP copy-in, {n} shards")
    comp = [(r[0], r[2]) for r in rows if r[2] is not None]
    b.bar([c[0] for c in comp], [c[1] for c in comp], color=["tab:red", "tab:green", "tab:blue"])
    b.set_ylabel("compile time (s)")
    b.set_title("cold compile")
    for ax in (a, b):
        ax.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
