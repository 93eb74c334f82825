"""The benchmark workloads, as named data.

Each :class:`Workload` builds fresh, deterministic tensors (fixed seed) for one call of the op it
measures. Destinations start zeroed, so a pair the fast path forgets to write shows up in the
bitwise comparison against stock. Sizes are element counts; times elsewhere are microseconds.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Union

import torch

__all__ = [
    "ForeachArgs", "CopyInArgs", "CopyOutArgs", "ChunkCatArgs", "DispatchArgs", "ExampleArgs", "Target", "Workload", "WORKLOADS", "by_name",
    "LLAMA_BLOCK", "LLAMA_WORLD_SIZE", "FSDP_EXAMPLE",
]

_SEED = 20240603
_f32, _bf16 = torch.float32, torch.bfloat16


@dataclasses.dataclass
class ForeachArgs:
    """Arguments of ``torch._foreach_copy_(dsts, srcs)``."""

    dsts: list[torch.Tensor]
    srcs: list[torch.Tensor]

    @property
    def outputs(self) -> list[torch.Tensor]:
        """Tensors the op writes (compared bitwise against stock)."""
        return self.dsts

    @property
    def pairs(self) -> int:
        return len(self.dsts)

    @property
    def numel(self) -> int:
        """Elements copied by one call."""
        return sum(d.numel() for d in self.dsts)

    @property
    def dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        """(src dtype, dst dtype) of the first pair; every workload uses one pair of dtypes."""
        return self.srcs[0].dtype, self.dsts[0].dtype


@dataclasses.dataclass
class CopyInArgs:
    """Arguments of ``fsdp.all_gather_copy_in(inputs, output, split_sizes, numel, rank)``.

    ``output`` holds ``world_size * numel`` elements; this rank writes ``numel`` of them.
    """

    inputs: list[torch.Tensor]
    output: torch.Tensor
    split_sizes: list[int]
    numel: int
    rank: int
    world_size: int

    @property
    def outputs(self) -> list[torch.Tensor]:
        return [self.output]

    @property
    def pairs(self) -> int:
        return len(self.inputs)

    @property
    def dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        return self.inputs[0].dtype, self.output.dtype


@dataclasses.dataclass
class CopyOutArgs:
    """Arguments of FSDP2's all-gather copy-out, ``fsdp.split_with_sizes_copy(all_gather_output,
    split_sizes, dim=1, out=out)``: ``all_gather_output`` viewed ``(world_size, -1)``, one
    ``(world_size, size)`` destination per parameter."""

    all_gather_output: torch.Tensor
    split_sizes: list[int]
    out: list[torch.Tensor]

    @property
    def outputs(self) -> list[torch.Tensor]:
        return self.out

    @property
    def pairs(self) -> int:
        return self.all_gather_output.shape[0] * len(self.out)  # one row per rank and parameter

    @property
    def numel(self) -> int:
        return self.all_gather_output.numel()

    @property
    def dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        return self.all_gather_output.dtype, self.out[0].dtype


@dataclasses.dataclass
class ChunkCatArgs:
    """Arguments of FSDP2's reduce-scatter copy-in, ``fsdp.chunk_cat(grads, 0, world_size,
    out=out)``: bf16 unsharded gradients into an fp32 ``(world_size, -1)`` reduce-scatter input."""

    tensors: list[torch.Tensor]
    num_chunks: int
    out: torch.Tensor

    @property
    def outputs(self) -> list[torch.Tensor]:
        return [self.out]

    @property
    def pairs(self) -> int:
        return self.num_chunks * len(self.tensors)  # one chunk per rank and gradient

    @property
    def numel(self) -> int:
        return self.out.numel()

    @property
    def dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        return self.tensors[0].dtype, self.out.dtype


@dataclasses.dataclass
class DispatchArgs:
    """Operands of one op the mode does not intercept (``torch.add(a, b)``)."""

    a: torch.Tensor
    b: torch.Tensor


@dataclasses.dataclass
class ExampleArgs:
    """One run of an example script in a subprocess: ``python script --steps N *argv``, which prints
    one JSON object (``steps``: a full run's N, ``quick_steps``: ``--quick``'s)."""

    script: str
    argv: list[str]
    steps: int
    quick_steps: int


Args = Union[ForeachArgs, CopyInArgs, CopyOutArgs, ChunkCatArgs, DispatchArgs, ExampleArgs]


@dataclasses.dataclass(frozen=True)
class Target:
    """One goal from issue 3: ``metric op threshold`` (op is ``>=`` or ``<=``).

    Metrics: ``speedup_direct`` (stock time / direct time, x), ``efficiency_direct`` (roofline
    time / direct time), ``mode_vs_bound`` (``speedup_mode`` over ``speedup_direct``), ``extra_us_vs_no_mode`` (an op the mode does not own, inside
    ``NpuFastCopyMode()`` minus without it, microseconds per op), ``step_speedup`` (a training
    step's time without the mode / under it).
    """

    metric: str
    op: str
    threshold: float

    def check(self, value: float | None) -> bool:
        if value is None:
            return False
        return value >= self.threshold if self.op == ">=" else value <= self.threshold

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g}"


@dataclasses.dataclass(frozen=True)
class Workload:
    """A named benchmark case: ``build()`` returns fresh arguments for one call."""

    name: str
    description: str
    build: Callable[[], Args]
    targets: tuple[Target, ...] = ()
    # Run once, in the suite's own process, never per worker process (it starts its own).
    once: bool = False


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(_SEED)


def _separate(sizes: list[int], src_dtype: torch.dtype, dst_dtype: torch.dtype) -> ForeachArgs:
    """One allocation per tensor, as optimizer states or per-parameter shards are."""
    g = _gen()
    srcs = [torch.randn(n, generator=g).to(src_dtype) for n in sizes]
    dsts = [torch.zeros(n, dtype=dst_dtype) for n in sizes]
    return ForeachArgs(dsts, srcs)


# 64..256 elements, spread (not sorted) over 512 tensors.
TINY_SIZES = [64 + (i * 61) % 193 for i in range(512)]
# 64, 128, ..., 4096 repeated: 200 tensors, 232,192 elements in all.
SMALL_SIZES = [64 << (i % 7) for i in range(200)]


def _adjacent() -> ForeachArgs:
    # FSDP2 copy-in under mixed precision: the inputs are torch.split views of the bf16 cast
    # buffer and the outputs split views of the all-gather buffer: both sides adjacent.
    total = sum(SMALL_SIZES)
    src = torch.randn(total, generator=_gen()).to(_bf16)
    dst = torch.zeros(total, dtype=_bf16)
    return ForeachArgs(list(torch.split(dst, SMALL_SIZES)), list(torch.split(src, SMALL_SIZES)))


# One Llama-3-8B block: (name, shape) of each parameter, in registration order.
LLAMA_BLOCK: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("attention.wq", (4096, 4096)),
    ("attention.wk", (1024, 4096)),
    ("attention.wv", (1024, 4096)),
    ("attention.wo", (4096, 4096)),
    ("feed_forward.w1", (14336, 4096)),
    ("feed_forward.w2", (4096, 14336)),
    ("feed_forward.w3", (14336, 4096)),
    ("attention_norm.weight", (4096,)),
    ("ffn_norm.weight", (4096,)),
)
LLAMA_WORLD_SIZE = 8


def _shard_numel(shape: tuple[int, ...], world_size: int) -> int:
    """Elements of one rank's padded dim-0 shard, as FSDP2 ``FSDPParam`` allocates it."""
    rows = -(-shape[0] // world_size)  # torch.chunk size of dim 0; the last chunk is padded to it
    rest = 1
    for s in shape[1:]:
        rest *= s
    return rows * rest


def _llama_block_copy_in(rank: int = 1) -> CopyInArgs:
    # Full size (no scaling): 27.3M fp32 elements per rank (109 MB of inputs), a 873 MB
    # all-gather output; about 2 GB with the roofline buffers and the stock snapshot.
    # fp32 -> fp32, no mixed precision: each input is its own parameter's shard allocation.
    g = _gen()
    sizes = [_shard_numel(shape, LLAMA_WORLD_SIZE) for _, shape in LLAMA_BLOCK]
    inputs = [torch.randn(n, generator=g) for n in sizes]
    numel = sum(sizes)
    output = torch.zeros(numel * LLAMA_WORLD_SIZE, dtype=_f32)
    return CopyInArgs(inputs, output, sizes, numel, rank, LLAMA_WORLD_SIZE)


# 200 bf16 shards of 256..1024 elements (a fixed draw), world size 8: issue 20's copy-out and
# chunk_cat lists.
SHARDS_200 = [256 + (i * 389) % 769 for i in range(200)]
FSDP_WORLD_SIZE = 8
# The Llama-3-8B block at a quarter of its elements (2-D shapes halved, norms quartered).
LLAMA_QUARTER: tuple[tuple[int, ...], ...] = tuple(
    (shape[0] // 2, shape[1] // 2) if len(shape) == 2 else (shape[0] // 4,) for _, shape in LLAMA_BLOCK)


def _copy_out(sizes: list[int]) -> CopyOutArgs:
    g = _gen()
    total = sum(sizes)
    src = torch.randn(FSDP_WORLD_SIZE * total, generator=g).to(_bf16).view(FSDP_WORLD_SIZE, total)
    out = [torch.zeros(FSDP_WORLD_SIZE, n, dtype=_bf16) for n in sizes]
    return CopyOutArgs(src, list(sizes), out)


def _chunk_cat(shapes: list[tuple[int, ...]]) -> ChunkCatArgs:
    g = _gen()
    grads = [torch.randn(shape, generator=g).to(_bf16) for shape in shapes]
    width = sum(-(-s[0] // FSDP_WORLD_SIZE) * (s[1] if len(s) > 1 else 1) for s in shapes)
    return ChunkCatArgs(grads, FSDP_WORLD_SIZE, torch.zeros(FSDP_WORLD_SIZE, width, dtype=_f32))


def _add16() -> DispatchArgs:
    g = _gen()
    return DispatchArgs(torch.randn(16, generator=g), torch.randn(16, generator=g))


# The repository's examples/fsdp_train.py; absent from a wheel install.
FSDP_EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "examples", "fsdp_train.py")


def _fsdp_example() -> ExampleArgs:
    if not os.path.isfile(FSDP_EXAMPLE):
        raise FileNotFoundError(f"no {FSDP_EXAMPLE} (the examples ship with the repository, not the wheel)")
    return ExampleArgs(FSDP_EXAMPLE, ["--world-size", "2", "--json"], steps=40, quick_steps=6)


_ge = lambda m, t: Target(m, ">=", t)  # noqa: E731
# Through the mode, within 10 % of the direct op's speed-up.
_MODE = _ge("mode_vs_bound", 0.9)

WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "tiny_many",
        "512 separate fp32 tensors of 64..256 elements, fp32 -> fp32 (dispatch bound)",
        lambda: _separate(TINY_SIZES, _f32, _f32),
        (_ge("speedup_direct", 6), _MODE),
    ),
    Workload(
        "small_many",
        "200 separate fp32 tensors, sizes cycling 64, 128, ..., 4096 elements, fp32 -> fp32",
        lambda: _separate(SMALL_SIZES, _f32, _f32),
        (_ge("speedup_direct", 3), _ge("efficiency_direct", 0.75), _MODE),
    ),
    Workload(
        "small_many_cast",
        "the small_many list copied fp32 -> bf16 (FSDP2 mixed-precision cast)",
        lambda: _separate(SMALL_SIZES, _f32, _bf16),
        (_ge("speedup_direct", 3), _ge("efficiency_direct", 0.75), _MODE),
    ),
    Workload(
        "adjacent",
        "small_many sizes as torch.split views of one flat bf16 buffer into split views of "
        "another, bf16 -> bf16 (FSDP2 copy-in under mixed precision)",
        _adjacent,
        (_ge("speedup_direct", 3), _ge("efficiency_direct", 0.75), _MODE),
    ),
    Workload(
        "large",
        "16 separate fp32 tensors of 4M elements, fp32 -> fp32 (memory bound)",
        lambda: _separate([4 << 20] * 16, _f32, _f32),
        (_ge("speedup_direct", 0.95), _ge("efficiency_direct", 0.9), _MODE),
    ),
    Workload(
        "moe_many",
        "1024 separate fp32 tensors of 16K elements, fp32 -> fp32 (memory bound)",
        lambda: _separate([16 << 10] * 1024, _f32, _f32),
        (_ge("speedup_direct", 0.95), _ge("efficiency_direct", 0.9), _MODE),
    ),
    Workload(
        "llama_block_copy_in",
        "fsdp.all_gather_copy_in of one Llama-3-8B block's dim-0 shards (wq, wk, wv, wo, w1, w2, "
        "w3, 2 norms) at world size 8, rank 1, fp32 -> fp32, full size",
        _llama_block_copy_in,
        (_ge("efficiency_direct", 0.8), _ge("speedup_direct", 1.0), _MODE),
    ),
    Workload(
        "copy_out_200",
        "fsdp.split_with_sizes_copy (all-gather copy-out) of 200 bf16 shards of 256..1024 elements at "
        "world size 8: 1600 rows into the parameters' storages",
        lambda: _copy_out(SHARDS_200),
        (_ge("speedup_direct", 3), _ge("efficiency_direct", 0.5), _MODE),
    ),
    Workload(
        "chunk_cat_200",
        "fsdp.chunk_cat (reduce-scatter copy-in) of 200 bf16 gradients of 256..1024 elements into an "
        "fp32 (8, -1) buffer: padding and the widening cast",
        lambda: _chunk_cat([(n,) for n in SHARDS_200]),
        (_ge("speedup_direct", 4), _ge("efficiency_direct", 0.5), _MODE),
    ),
    Workload(
        "copy_out_llama",
        "fsdp.split_with_sizes_copy of one Llama-3-8B-like block (a quarter of its elements), world "
        "size 8, bf16",
        lambda: _copy_out([_shard_numel(s, FSDP_WORLD_SIZE) for s in LLAMA_QUARTER]),
        (_ge("speedup_direct", 1.0), _ge("efficiency_direct", 0.9), _MODE),
    ),
    Workload(
        "chunk_cat_llama",
        "fsdp.chunk_cat of one Llama-3-8B-like block's bf16 gradients (a quarter of its elements) into "
        "fp32, world size 8",
        lambda: _chunk_cat(list(LLAMA_QUARTER)),
        (_ge("speedup_direct", 1.8), _ge("efficiency_direct", 0.7), _MODE),
    ),
    Workload(
        "mode_overhead",
        "torch.add of two 16-float tensors (an op the mode does not own): no mode vs "
        "NpuFastCopyMode() vs the debugging NpuFastCopyMode(strict=True)",
        _add16,
        (Target("extra_us_vs_no_mode", "<=", 0.1),),
    ),
    Workload(
        "fsdp_step",
        "examples/fsdp_train.py: FSDP2 training steps of its TinyLlama (fully_shard per block, bf16 "
        "mixed precision), 2 gloo ranks, stock and under NpuFastCopyMode() interleaved, in one run",
        _fsdp_example,
        (_ge("step_speedup", 1.0),),
        once=True,
    ),
)


def by_name(names: list[str] | None = None) -> list[Workload]:
    """The workloads named, in suite order (all when ``names`` is None).

    Raises:
        KeyError: an unknown name (the message lists the known ones).
    """
    if not names:
        return list(WORKLOADS)
    known = {w.name: w for w in WORKLOADS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(known)}")
    wanted = set(names)
    return [w for w in WORKLOADS if w.name in wanted]
