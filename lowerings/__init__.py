"""Inductor lowerings for the copy fast path (imported as ``npu_dispatch.lowerings``).

Placeholder: the lowerings land with issue 4.
"""
