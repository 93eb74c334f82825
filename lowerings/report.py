"""What Inductor's generated code does to fill each collective's bucket: a debugging tool.

:func:`bucket_copies` reads the Python wrapper Inductor writes for a graph (``TORCH_LOGS=output_code``,
``torch._inductor.utils.run_and_get_code``, or a module of ``PyCodeCache.modules``) and, for each
bucketed collective (``all_gather_into_tensor_out`` into a bucket, ``reduce_scatter_tensor`` of
one), lists the kernel calls and extern calls that write the bucket since the previous collective,
and the bytes of the temporaries those kernels also write. Stock Inductor's default-mode copy-in,
for example, is one kernel that writes a bucket-sized fp32 temporary next to the bf16 bucket; the
lowered one writes the bucket alone.

:func:`time_bucket_copies` wraps those kernels in a module so that ``torch.profiler`` shows each
call as ``bucket copy: <collective>: <kernel>`` (extern ops show under their own names, e.g.
``bucketing::_pre_bucket_all_gather``).

The parser knows the C++ wrapper (``cpp_fused_*``) and Triton (``triton_*``) kernel calls of
torch 2.13-2.14; a line it does not know is skipped, so a count can only be low, never invented.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from types import ModuleType

import torch

__all__ = ["BucketCopy", "bucket_copies", "time_bucket_copies", "TIMED_PREFIX"]

TIMED_PREFIX = "bucket copy: "
_ITEM = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "int8": 1, "uint8": 1, "bool": 1}
_ALIAS = re.compile(r"^(\w+) = (?:reinterpret_tensor\((\w+),|(buf\d+)$)")
_ALLOC = re.compile(r"^(\w+) = empty_strided_\w+\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)")
_KERNEL = re.compile(r"^(?:\w+ = )?((?:cpp_fused|triton)\w*)(?:\.run)?\((.*)\)$")
_EXTERN = re.compile(r"^(?:(\w+) = )?torch\.ops\.(\w+)\.(\w+)\.\w+\((.*)\)$")
_NAME = re.compile(r"\b(buf\d+|primals_\d+|arg\d+_\d+)\b")


@dataclasses.dataclass
class BucketCopy:
    """How one collective's bucket is filled in one graph's generated code.

    Attributes:
        collective: ``"all_gather"`` or ``"reduce_scatter"``.
        bucket: the buffer's name in the generated code.
        kernels: names of the generated kernels that write the bucket, in call order.
        externs: ``namespace::op`` of the extern calls that write it (``bucketing::...``,
            ``npu_dispatch::foreach_copy_``).
        temp_bytes: bytes of the other buffers, allocated since the previous collective, that
            those kernels take (a bucket-sized temporary shows here; so do the other outputs of
            a kernel that fuses the copy with its producers).
    """

    collective: str
    bucket: str
    kernels: list[str]
    externs: list[str]
    temp_bytes: int


def _body(src: str) -> list[str]:
    lines, inside = [], False
    for line in src.splitlines():
        if line.strip().startswith("def call(self, args)") or line.startswith("def call(args)"):
            inside = True
            continue
        if inside:
            if line and not line.startswith(" "):
                break
            lines.append(line.strip())
    return lines


def bucket_copies(src: str) -> list[BucketCopy]:
    """The bucket copies of one generated wrapper's ``call`` (see the module docstring)."""
    lines = _body(src)
    alias: dict[str, str] = {}
    alloc: dict[str, int] = {}

    def root(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    out: list[BucketCopy] = []
    span: list[str] = []
    for line in lines:
        m = _ALIAS.match(line)
        if m:
            alias[m.group(1)] = m.group(2) or m.group(3)
        m = _ALLOC.match(line)
        if m:
            n = 1
            for d in filter(None, (s.strip() for s in m.group(2).split(","))):
                n *= int(d) if d.isdigit() else 0
            alloc[m.group(1)] = n * _ITEM.get(m.group(3), 0)
        bucket = kind = None
        if "_c10d_functional.all_gather_into_tensor_out" in line:
            mo = re.search(r"out=(\w+)", line)
            bucket, kind = (root(mo.group(1)) if mo else None), "all_gather"
        elif "_c10d_functional.reduce_scatter_tensor." in line:
            mo = re.search(r"reduce_scatter_tensor\.default\((?:reinterpret_tensor\()?(\w+)", line)
            bucket, kind = (root(mo.group(1)) if mo else None), "reduce_scatter"
        if bucket is None:
            if kind is None:
                span.append(line)
            continue
        kernels, externs, temps = [], [], set()
        for s in span:
            k = _KERNEL.match(s)
            if k:
                roots = {root(a) for a in _NAME.findall(k.group(2))}
                if bucket in roots:
                    kernels.append(k.group(1))
                    temps |= {r for r in roots if r != bucket and r in alloc}
                continue
            e = _EXTERN.match(s)
            if e and e.group(2) != "_c10d_functional":
                written = {root(a) for a in _NAME.findall(e.group(4))} | ({root(e.group(1))} if e.group(1) else set())
                if bucket in written:
                    externs.append(f"{e.group(2)}::{e.group(3)}")
        out.append(BucketCopy(kind, bucket, kernels, externs, sum(alloc[t] for t in temps)))
        span = []
    return out


def time_bucket_copies(module: ModuleType) -> list[str]:
    """Wrap the bucket-writing kernels of a loaded wrapper ``module`` in profiler ranges named
    ``bucket copy: <collective>: <kernel>``; returns the labels. Idempotent."""
    with open(module.__file__) as f:
        copies = bucket_copies(f.read())
    labels = []
    for copy in copies:
        for name in copy.kernels:
            fn = getattr(module, name, None)
            if fn is None or getattr(fn, "_npu_dispatch_timed", False):
                continue
            label = f"{TIMED_PREFIX}{copy.collective}: {name}"

            @functools.wraps(fn)
            def timed(*args, __fn=fn, __label=label):
                with torch.profiler.record_function(__label):
                    return __fn(*args)

            timed._npu_dispatch_timed = True
            setattr(module, name, timed)
            labels.append(label)
    return labels
