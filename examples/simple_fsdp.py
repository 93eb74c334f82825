"""Compile-first FSDP in a few lines: DTensor parameters and one parametrization, after SimpleFSDP.

SimpleFSDP (Zhang et al., "SimpleFSDP: Simpler Fully Sharded Data Parallel with torch.compile",
arXiv 2411.00284; torchtitan ``experiments/simple_fsdp``) keeps every parameter as a DTensor
``Shard(0)`` and reads it through a parametrization that redistributes it to ``Replicate()`` with
the mixed-precision cast (``forward_dtype``) and declares its gradient ``Partial("avg")`` reduced
in ``backward_dtype``. The whole model is then compiled: the all-gathers, casts and
reduce-scatters are ordinary graph nodes, and Inductor's collective bucketing
(``torch._inductor.config.bucket_all_gathers_fx`` / ``bucket_reduce_scatters_fx``) merges them
into one collective per bucket. torchtitan 0.3.0 on PyPI does not ship this frontend and its
package needs datasets, wandb and tensorboard, so this file follows the paper instead.

Only what the example and the tests need: 1-D meshes, ``Shard(0)``, no HSDP, no TP.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

__all__ = ["data_parallel", "bucketing_config"]


class _ReplicateCompute(nn.Module):
    """``Shard(0)`` DTensor -> local replicated tensor in ``param_dtype`` (all-gather + cast)."""

    def __init__(self, param_dtype: torch.dtype | None, reduce_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype

    def forward(self, x: DTensor) -> torch.Tensor:
        full = x.redistribute(placements=[Replicate()], forward_dtype=self.param_dtype, backward_dtype=self.reduce_dtype)
        return full.to_local(grad_placements=[Partial("avg")])


def _parametrize(module: nn.Module, names: list[str], compute: _ReplicateCompute) -> None:
    """Read each parameter through ``compute`` (a property on a per-module subclass, as
    torchtitan does, so ``state_dict`` and the optimizer see the sharded DTensor)."""
    props = {n: property(lambda self, n=n: compute(self._parameters[n])) for n in names}
    module.__class__ = type(f"SimpleFSDP{module.__class__.__name__}", (module.__class__,), props)


def data_parallel(
    model: nn.Module,
    mesh: DeviceMesh,
    param_dtype: torch.dtype | None = torch.bfloat16,
    reduce_dtype: torch.dtype | None = torch.float32,
) -> nn.Module:
    """Shard every parameter of ``model`` as a DTensor ``Shard(0)`` over the 1-D ``mesh``.

    Args:
        model: parameters on ``mesh``'s device type; tied parameters stay tied.
        mesh: a 1-D device mesh (the data-parallel ranks).
        param_dtype: the dtype of the gathered parameter (None: keep the parameter's).
        reduce_dtype: the dtype the gradient is reduce-scattered in (None: the gradient's).

    Returns:
        ``model``, modified in place.
    """
    compute = _ReplicateCompute(param_dtype, reduce_dtype)
    done: dict[int, nn.Parameter] = {}
    for mod in list(model.modules()):
        names = []
        for name, p in list(mod.named_parameters(recurse=False)):
            if id(p) not in done:
                done[id(p)] = nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)]))
            mod.register_parameter(name, done[id(p)])
            names.append(name)
        if names:
            _parametrize(mod, names, compute)
    return model


def bucketing_config(mode: str = "default") -> dict:
    """Inductor config for SimpleFSDP's collective bucketing (``torch._inductor.config.patch``).

    Args:
        mode: ``"default"`` (the bucket copy-in is ``cat`` + ``copy_``, the reduce-scatter copy-in
            ``cat(dim=1)``) or ``"custom_ops"`` (``bucketing::_pre_bucket_all_gather`` and
            ``bucketing::_pre_bucket_reduce_scatter``, what torchtitan's per-block bucketing uses).
    """
    return {
        "bucket_all_gathers_fx": "all",
        "bucket_reduce_scatters_fx": "all",
        "bucket_all_gathers_bucket_mode": mode,
        "bucket_reduce_scatters_bucket_mode": mode,
    }
