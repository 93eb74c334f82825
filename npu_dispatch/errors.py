"""Errors raised by the debugging switches of ``NpuFastCopyMode`` (stock errors pass unchanged)."""

__all__ = ["FastCopyFallbackError", "FastCopyMismatchError"]


class FastCopyFallbackError(RuntimeError):
    """``strict=True``: a call would leave the fast path; raised before anything is written."""


class FastCopyMismatchError(RuntimeError):
    """``verify=True``: the fast path's result differs bitwise from the stock op's."""
