"""Integrations of :class:`npu_dispatch.NpuFastCopyMode` with training frameworks.

Each submodule is imported on its own and only then imports its framework (an optional
dependency): ``npu_dispatch.integrations.torchtitan`` for torchtitan's ``--module``.
"""
