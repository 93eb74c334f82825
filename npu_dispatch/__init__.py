"""npu_dispatch: a bitwise-exact fast path for foreach copies and FSDP2 all-gather copy-in.

Public API: :class:`NpuFastCopyMode`, :func:`foreach_copy_`, :func:`all_gather_copy_in`,
:func:`explain`, :mod:`npu_dispatch.capabilities`, :class:`CopyStats`.
"""
from . import capabilities
from .errors import FastCopyFallbackError, FastCopyMismatchError
from .explain import explain
from .mode import NpuFastCopyMode
from .ops import all_gather_copy_in, chunk_cat, foreach_copy_, split_with_sizes_copy
from .stats import CopyStats, global_stats

__all__ = [
    "NpuFastCopyMode",
    "foreach_copy_",
    "all_gather_copy_in",
    "split_with_sizes_copy",
    "chunk_cat",
    "explain",
    "capabilities",
    "CopyStats",
    "global_stats",
    "FastCopyFallbackError",
    "FastCopyMismatchError",
]
__version__ = "0.1.0"
