"""torch_npu's own ``fully_shard`` (``torch_npu.distributed.fsdp``, torch-npu 2.14.0) under
NpuFastCopyMode, 2 gloo CPU ranks: with its memory cache on (``module._use_mem_cache = True``: the
all-gather outputs and reduce-scatter inputs are views of cached buffers, some of larger ones) and
every block recomputed in backward (activation checkpointing), training is bitwise stock's
(losses, gradients and parameters after every step), every copy FSDP issues is served, none falls
back, and the cache did hand out reused buffers and views of larger ones.

torch_npu cannot be installed here (without Ascend CANN it breaks ``import torch``): the test reads
the one file that implements that ``fully_shard`` (``torch_npu/distributed/fsdp/_add_fsdp_patch.py``,
which imports only torch) out of the torch-npu wheel, downloaded once with ``pip download`` into
``NPU_DISPATCH_CACHE`` (default ``~/.cache/npu_dispatch``), and loads it by path in the spawned
ranks only: it patches FSDP2's classes for the whole process, so this process never loads it.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from cases import require_native, same_shards as _same, shard_bits as _bits

require_native(distributed=True)

TORCH_NPU = "2.14.0"
PATCH_FILE = "torch_npu/distributed/fsdp/_add_fsdp_patch.py"
STEPS = 3
# Block widths: the first block is the widest, so the later blocks' all-gathers in forward (and
# the narrower gradients' reduce-scatters) get views of its larger cached buffer.
WIDTHS = (48, 32, 24, 40)
DIM = 16


def _cache_dir() -> Path:
    return Path(os.environ.get("NPU_DISPATCH_CACHE", Path.home() / ".cache" / "npu_dispatch"))


def _wheel() -> Path | None:
    """A torch-npu wheel of TORCH_NPU in the cache, downloaded there first if none is; None (and
    pytest.skip with pip's last line) where the index cannot give one. The file read out of it is
    pure Python and the same in every platform's wheel, so any one will do."""
    cache = _cache_dir()
    found = sorted(glob.glob(str(cache / f"torch_npu-{TORCH_NPU}-*.whl")))
    if found:
        return Path(found[0])
    cache.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", f"torch-npu=={TORCH_NPU}", "--no-deps", "--only-binary=:all:",
            "-d", str(cache)]
    # This interpreter's own wheel, else the CPython 3.11 x86-64 one (the file read is the same).
    tries = [base, base + ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                           "--platform", "manylinux_2_28_x86_64"]]
    last = ""
    for cmd in tries:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            last = f"{type(e).__name__}: {e}"
            continue
        found = sorted(glob.glob(str(cache / f"torch_npu-{TORCH_NPU}-*.whl")))
        if found:
            return Path(found[0])
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
    pytest.skip(f"torch-npu=={TORCH_NPU} could not be downloaded into {cache} ({last})")
    return None


@pytest.fixture(scope="module")
def patch_file(tmp_path_factory) -> Path:
    """torch_npu's ``_add_fsdp_patch.py``, copied out of the wheel into a temporary folder."""
    wheel = _wheel()
    try:
        with zipfile.ZipFile(wheel) as z:
            text = z.read(PATCH_FILE)
    except (zipfile.BadZipFile, KeyError) as e:
        pytest.skip(f"{wheel.name} has no readable {PATCH_FILE}: {e}")
    # The FSDP2 methods the file patches must exist in this torch (torch_npu's release is made for
    # one torch: torch-npu 2.14.0's file patches a method torch 2.15 no longer has).
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    missing = sorted({m for m in re.findall(r"FSDPParamGroup\.(\w+)", text.decode()) if not hasattr(FSDPParamGroup, m)})
    if missing:
        pytest.skip(f"torch-npu=={TORCH_NPU}'s {PATCH_FILE} patches FSDPParamGroup.{', '.join(missing)}, which torch "
                    f"{torch.__version__} does not have")
    out = tmp_path_factory.mktemp("torch_npu_fsdp") / "_add_fsdp_patch.py"
    out.write_bytes(text)
    return out


def _load_patch(path: str):
    """torch_npu's module, loaded by path (no torch_npu package: the file imports only torch)."""
    spec = importlib.util.spec_from_file_location("torch_npu_add_fsdp_patch", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class _CacheUse:
    """Wraps the cache's ``allocate`` (same buffers returned): counts, per phase, the allocations
    (``calls``), those served from a buffer the cache already held (``reused``), and those that
    are views of a larger cached buffer (``views``)."""

    def __init__(self, cache):
        self.phase = "stock"
        self.counts = {p: {"calls": 0, "reused": 0, "views": 0} for p in ("stock", "mode")}
        original = cache.allocate

        def allocate(size, *, dtype, device):
            held = {b.untyped_storage().data_ptr() for b in cache.buffers[dtype]}
            out = original(size, dtype=dtype, device=device)
            row = self.counts[self.phase]
            row["calls"] += 1
            row["reused"] += out.untyped_storage().data_ptr() in held
            row["views"] += out.numel() * out.element_size() < out.untyped_storage().nbytes()
            return out

        cache.allocate = allocate


class _CountCopies(TorchDispatchMode):
    """Stock's calls of each FSDP copy op (the reference counts; stock only, never under the mode)."""

    def __init__(self, ops):
        super().__init__()
        self.ops = ops
        self.calls = dict.fromkeys(ops.values(), 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = self.ops.get(func)
        if name is not None:
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


class _Blocks(torch.nn.Module):
    """Blocks of different widths, each recomputed in backward (non-reentrant checkpoint around the
    sharded block: its FSDP hooks run again during the recompute)."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(DIM, w), torch.nn.GELU(), torch.nn.Linear(w, DIM)) for w in WIDTHS)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False)
        return x


def _model(fully_shard):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    torch.manual_seed(0)
    model = _Blocks()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        block._use_mem_cache = True  # read by torch_npu's FSDPParamGroup.__init__ at fully_shard
        fully_shard(block, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _copy_ops() -> dict:
    """FSDP's copy ops of this torch, as the mode's stats name them."""
    from cases import RS_COPY_IN

    names = ["aten._foreach_copy_", "fsdp.all_gather_copy_in", "fsdp.split_with_sizes_copy", RS_COPY_IN]
    ops = {}
    for name in names:
        ns, op = name.split(".")
        packet = getattr(getattr(torch.ops, ns), op)
        for overload in packet.overloads():
            ops[getattr(packet, overload)] = name
    return ops


def _worker(rank, world, port, patch_path, out):
    import npu_dispatch as nd

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        patch = _load_patch(patch_path)
        cache_use = _CacheUse(patch._fsdp_mem_cache)
        stock, stock_opt = _model(patch.fully_shard)
        fast, fast_opt = _model(patch.fully_shard)
        ops = _copy_ops()
        mode = nd.NpuFastCopyMode()
        gen = torch.Generator().manual_seed(rank)
        same, stock_calls = [], dict.fromkeys(ops.values(), 0)
        for _ in range(STEPS):
            x = torch.randn(8, DIM, generator=gen)
            counter = _CountCopies(ops)
            cache_use.phase = "stock"
            with counter:
                stock_loss = stock(x).float().pow(2).mean()
                stock_loss.backward()
            for k, v in counter.calls.items():
                stock_calls[k] += v
            cache_use.phase = "mode"
            with mode:
                fast_loss = fast(x).float().pow(2).mean()
                fast_loss.backward()
            grads_equal = _same([p.grad for p in stock.parameters()], [p.grad for p in fast.parameters()])
            stock_opt.step()
            fast_opt.step()
            params_equal = _same(list(stock.parameters()), list(fast.parameters()))
            same.append((bool(torch.equal(_bits(stock_loss), _bits(fast_loss))), grads_equal, params_equal))
            stock_opt.zero_grad()
            fast_opt.zero_grad()
        result = {"same": same, "stock_calls": stock_calls, "ops": mode.stats.as_dict()["ops"],
                  "fast_path_calls": mode.stats.fast_path_calls,
                  "fallback_calls": mode.stats.total_fallback_calls,
                  "fallback_reasons": dict(mode.stats.fallback_reasons),
                  "cache": cache_use.counts,
                  "cached_buffers": sum(len(v) for v in patch._fsdp_mem_cache.buffers.values())}
        torch.save(result, f"{out}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown under gloo's threads


def test_torch_npu_fully_shard_with_mem_cache_and_recompute_is_served_and_bitwise_stock(patch_file):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.spawn(_worker, args=(2, port, str(patch_file), out), nprocs=2)
        results = [torch.load(f"{out}.{rank}") for rank in range(2)]
    for rank, r in enumerate(results):
        assert r["same"] == [(True, True, True)] * STEPS, (rank, r["same"])
        # Every copy stock issued was served under the mode, none left the fast path.
        for name, calls in r["stock_calls"].items():
            assert calls > 0, (rank, name, r["stock_calls"])
            assert r["ops"][name]["calls"] == calls, (rank, name, r["ops"][name], calls)
            assert r["ops"][name]["fast_calls"] == calls, (rank, name, r["ops"][name], calls)
        assert r["fast_path_calls"] == sum(r["stock_calls"].values())
        assert r["fallback_calls"] == 0 and r["fallback_reasons"] == {}, r["fallback_reasons"]
        # The memory cache was in use under the mode: buffers reused, some as views of larger ones.
        assert r["cached_buffers"] > 0
        for phase in ("stock", "mode"):
            c = r["cache"][phase]
            assert c["calls"] > 0 and c["reused"] > 0 and c["views"] > 0, (rank, phase, c)
    print(f"\ntorch_npu fully_shard, rank 0: {results[0]['fast_path_calls']} copies served, "
          f"{results[0]['fallback_calls']} fallbacks; stock's calls {results[0]['stock_calls']}; "
          f"cache {results[0]['cache']['mode']}")
