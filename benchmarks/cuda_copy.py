"""Stock vs npu_dispatch on a CUDA device: median time per call and kernels launched per call.

    python -m benchmarks.cuda_copy [--out FILE.md]     # from the repository root

Workloads are the CPU suite's lists (benchmarks.workloads) moved to the GPU. Times come
from torch.utils.benchmark (which synchronizes CUDA around each block); kernel counts from one
profiled call. On CUDA the fast path is ATen's own fused ``_foreach_copy_`` (multi_tensor_apply),
so the differences measured here are the host-side cost of getting there, not a faster kernel.
"""
from __future__ import annotations

import argparse
import contextlib
import sys

import torch
import torch.distributed.fsdp  # noqa: F401  registers fsdp::all_gather_copy_in
from torch.profiler import ProfilerActivity, profile
from torch.utils.benchmark import Timer

import npu_dispatch as nd
from benchmarks import workloads as W

DEV = torch.device("cuda")


def kernels(fn) -> int:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def median_us(fn) -> float:
    return Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.3).median * 1e6


def variants(name):
    w = W.by_name([name])[0].build()
    if hasattr(w, "dsts"):
        d = [t.to(DEV) for t in w.dsts]
        s = [t.to(DEV) for t in w.srcs]

        def stock():
            torch._foreach_copy_(d, s)

        def direct():
            nd.foreach_copy_(d, s)
        return {"stock": stock, "direct": direct, "mode": stock}
    ins = [t.to(DEV) for t in w.inputs]
    out = w.output.to(DEV)
    args = (ins, out, w.split_sizes, w.numel, w.rank)

    def stock_ag():
        torch.ops.fsdp.all_gather_copy_in(*args)

    def direct_ag():
        nd.all_gather_copy_in(*args)
    return {"stock": stock_ag, "direct": direct_ag, "mode": stock_ag}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the markdown table here")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device visible", file=sys.stderr)
        return 2
    # adjacent is left out: moving its split views to the GPU would make them separate allocations.
    names = ["tiny_many", "small_many", "small_many_cast", "moe_many", "llama_block_copy_in"]
    lines = [f"{torch.cuda.get_device_name()} · torch {torch.__version__} · median us per call (kernels per call)", "",
             "| workload | stock | direct | mode | stock/direct | stock/mode |", "|---|---:|---:|---:|---:|---:|"]
    for name in names:
        v = variants(name)
        t, k = {}, {}
        for n, fn in v.items():
            # "mode": the stock call under one NpuFastCopyMode entered around the timing, as the
            # CPU suite does (entering it costs microseconds a call on its own).
            with nd.NpuFastCopyMode() if n == "mode" else contextlib.nullcontext():
                t[n], k[n] = median_us(fn), kernels(fn)
        lines.append(f"| {name} | {t['stock']:.1f} ({k['stock']}) | {t['direct']:.1f} ({k['direct']}) | "
                     f"{t['mode']:.1f} ({k['mode']}) | {t['stock'] / t['direct']:.2f}x | {t['stock'] / t['mode']:.2f}x |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
