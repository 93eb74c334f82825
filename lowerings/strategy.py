"""Which lowering a bucket copy gets: ``fused`` (Inductor writes) or ``native`` (one extern call).

``auto`` decides per graph node, from the node's device type and list length:

1. more than ``MAX_FUSED_TENSORS`` tensors -> ``native``: one extern call compiles in constant
   time, while Inductor schedules, fuses and compiles one loop per tensor (and a C++ or Triton
   kernel has argument limits);
2. device type ``cpu`` -> ``fused``: Inductor's C++ backend fuses the per-tensor writes (and the
   dtype cast that produces them) into one kernel;
3. a device whose Inductor backend declares ``BackendFeature.FOREACH`` (Triton on CUDA / XPU) ->
   ``fused``: the writes become one horizontal (foreach) kernel;
4. anything else, e.g. ``npu`` (torch_npu's Inductor backend has no foreach support, so each
   tensor would be its own kernel) -> ``native``: the run-time planner coalesces and batches.

Each decision is logged at INFO on ``npu_dispatch.lowerings`` (``TORCH_LOGS="+npu_dispatch"``).
"""
from __future__ import annotations

import logging

import torch

__all__ = ["STRATEGIES", "MAX_FUSED_TENSORS", "choose", "check"]

log = logging.getLogger("npu_dispatch.lowerings")

STRATEGIES = ("auto", "fused", "native")
# Above this many shards in one bucket, ``auto`` takes ``native``: a bucket of a few blocks stays
# fused; a whole large model's parameters in one bucket (thousands of shards) go native.
MAX_FUSED_TENSORS = 512


def check(strategy: str) -> str:
    """Returns ``strategy`` if it is one of :data:`STRATEGIES`.

    Raises:
        ValueError: any other value, naming the valid ones.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"npu_dispatch.lowerings: unknown strategy {strategy!r}; expected one of {STRATEGIES}")
    return strategy


def _has_foreach(device_type: str) -> bool:
    from torch._inductor.codegen.common import BackendFeature, get_backend_features

    try:
        return BackendFeature.FOREACH in get_backend_features(device_type)
    except Exception:  # no Inductor backend registered for this device type
        return False


def choose(requested: str, device: torch.device | str, n_tensors: int, op: str) -> str:
    """The strategy for one graph node (see the module docstring for ``auto``'s rule).

    Args:
        requested: one of :data:`STRATEGIES`.
        device: the device (or device type) of the node's destinations (the all-gather output,
            for copy-in).
        n_tensors: list length (pairs copied).
        op: the op's name, for the log line.
    """
    device_type = getattr(device, "type", device)
    if requested != "auto":
        why = "requested"
        chosen = requested
    elif n_tensors > MAX_FUSED_TENSORS:
        chosen, why = "native", f"{n_tensors} tensors > MAX_FUSED_TENSORS={MAX_FUSED_TENSORS}"
    elif device_type == "cpu":
        chosen, why = "fused", "the C++ backend fuses the writes into one kernel"
    elif _has_foreach(device_type):
        chosen, why = "fused", f"the Inductor backend for {device_type} has foreach kernels"
    else:
        chosen, why = "native", f"the Inductor backend for {device_type} has no foreach support"
    log.info("npu_dispatch.lowerings: %s of %d tensor(s) on %s -> %s (%s)", op, n_tensors, device, chosen, why)
    return chosen
