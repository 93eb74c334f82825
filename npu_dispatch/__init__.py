"""npu_dispatch: a bitwise-exact fast path for foreach copies and FSDP2 all-gather copy-in.

Public API: :class:`NpuFastCopyMode`, :func:`foreach_copy_`, :func:`all_gather_copy_in`,
:func:`explain`, :mod:`npu_dispatch.capabilities`, :class:`CopyStats`.
"""
from . import capabilities
from .errors import FastCopyFallbackError, FastCopyMismatchError
from .explain import explain
from .mode import NpuFastCopyMode
from .ops import all_gather_copy_in, foreach_copy_
from .stats import CopyStats, global_stats

__all__ = [
    "NpuFastCopyMode",
    "foreach_copy_",
    "all_gather_copy_in",
    "explain",
    "capabilities",
    "CopyStats",
    "global_stats",
    "FastCopyFallbackError",
    "FastCopyMismatchError",
]
__version__ = "0.1.0"
