"""The bucket copies of Inductor's collective bucketing, as graphs to compile: tests and benchmarks.

Inductor's bucketing pass (``torch/_inductor/fx_passes/bucketing.py``) traces its merge functions
with ``make_fx`` and splices them into the post-grad graph. The functions here are those merge
functions' copies without the collective, so that a single process can compile, run and time
exactly the graphs compile-first FSDP training compiles:

- :func:`copy_in_default`: bucket mode ``"default"``'s all-gather copy-in (``empty``, ``slice``,
  ``cat``, ``copy_``), the shards' casts folded into the ``copy_`` as the pass folds them;
- :func:`copy_in_custom_ops`: ``bucketing::_pre_bucket_all_gather``;
- :func:`rs_default`: bucket mode ``"default"``'s reduce-scatter copy-in, ``cat(dim=1)`` of the
  gradients' casts viewed ``(world, -1)``;
- :func:`rs_custom_ops`: the casts, then ``bucketing::_pre_bucket_reduce_scatter``.

:func:`compile_post_grad` compiles one with ``compile_fx_inner``, the stage the bucketing pass
runs in, stock or with ``npu_dispatch.lowerings`` active, and returns the generated code too.
"""
from __future__ import annotations

import torch

__all__ = ["copy_in_default", "copy_in_custom_ops", "rs_default", "rs_custom_ops", "compile_post_grad"]


def copy_in_default(world: int, rank: int, dtype: torch.dtype = torch.bfloat16):
    """``f(*shards) -> (bucket,)``: a new 1-D ``dtype`` bucket of ``world * n`` elements whose
    slice at ``n * rank`` holds ``cat`` of the flattened shards (the rest uninitialised)."""

    def f(*shards):
        n = sum(s.numel() for s in shards)
        out = torch.empty(world * n, dtype=dtype, device=shards[0].device)
        out.narrow(0, n * rank, n).copy_(torch.cat([s.reshape(-1) for s in shards]))
        return (out,)

    return f


def copy_in_custom_ops(world: int, rank: int, dtype: torch.dtype = torch.bfloat16, out_dtypes=None):
    """``f(*shards) -> (bucket,)`` through ``bucketing::_pre_bucket_all_gather`` (``out_dtypes``:
    each shard's dtype in the bucket, default ``dtype`` for all)."""
    from torch._inductor.fx_passes.bucketing import _ALL_DTYPES

    def f(*shards):
        dts = out_dtypes or [dtype] * len(shards)
        idx = [_ALL_DTYPES.index(d) for d in dts]
        return (torch.ops.bucketing._pre_bucket_all_gather(list(shards), world, dtype, idx, rank, None),)

    return f


def _cast(g, dtype):
    # As the post-grad graph has it; ``.to`` would trace as ``_to_copy``.
    return torch.ops.prims.convert_element_type.default(g, dtype)


def rs_default(world: int, dtype: torch.dtype = torch.float32):
    """``f(*grads) -> (bucket,)``: ``cat([g.to(dtype).reshape(world, -1)...], dim=1).flatten()``."""

    def f(*grads):
        return (torch.cat([_cast(g, dtype).reshape(world, -1) for g in grads], dim=1).flatten(),)

    return f


def rs_custom_ops(world: int, dtype: torch.dtype = torch.float32):
    """``f(*grads) -> (bucket,)`` through ``bucketing::_pre_bucket_reduce_scatter``."""
    import torch._inductor.fx_passes.bucketing  # noqa: F401  defines bucketing::

    def f(*grads):
        return (torch.ops.bucketing._pre_bucket_reduce_scatter([_cast(g, dtype) for g in grads], world),)

    return f


def compile_post_grad(fn, inputs, strategy: str | None = None):
    """``fn`` traced with ``make_fx`` and compiled by ``compile_fx_inner``.

    Args:
        fn: one of this module's graphs (or any function of tensors returning a tuple).
        inputs: example tensors, the ones the compiled function will take.
        strategy: None for stock Inductor, else the lowerings' strategy (``"auto"``, ``"fused"``,
            ``"native"``), active while compiling.

    Returns:
        ``(run, code)``: ``run(*tensors)`` returns ``fn``'s tuple; ``code`` is the generated
        Python wrapper.
    """
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.graph import GraphLowering
    from torch.fx.experimental.proxy_tensor import make_fx

    import npu_dispatch.lowerings as ndl

    gm = make_fx(fn)(*inputs)
    codes: list[str] = []
    save = GraphLowering.save_output_code
    GraphLowering.save_output_code = staticmethod(codes.append)
    try:
        if strategy is None:
            if ndl.is_registered():
                raise RuntimeError("compile_post_grad(strategy=None) needs stock lowerings: unregister() first")
            compiled = compile_fx_inner(gm, list(inputs))
        else:
            with ndl.active(strategy):
                compiled = compile_fx_inner(gm, list(inputs))
    finally:
        GraphLowering.save_output_code = save
    return (lambda *xs: compiled(list(xs))), (codes[-1] if codes else "")
