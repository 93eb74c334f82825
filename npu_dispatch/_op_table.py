"""The owned ops: the rows of ``csrc/dispatch/owned_ops.h``, read from that file.

C++ expands the same rows (csrc/dispatch/op_table.h), so the package keeps one list of the ops it
owns, and it holds where the native library is missing. Each row names the op's schema, the C++
kernel, the Python wrapper that serves it (``engine.HANDLERS``) and which of FSDP2's copies it
makes.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

from . import _build

__all__ = ["OwnedOp", "rows"]

# One row a line: NPU_DISPATCH_<STOCK|LIBRARY>_OP(id, kernel, wrapper, copy, "schema")
_ROW = re.compile(r'^NPU_DISPATCH_(STOCK|LIBRARY)_OP\((\w+), (\w+), (\w+), (\w+), "([^"]+)"\)$', re.M)


@dataclasses.dataclass(frozen=True)
class OwnedOp:
    """One owned op. ``schema`` as ``str(op._schema)`` prints it; ``intercepted``: a stock op the
    mode serves at BackendSelect (else the library's own ``npu_dispatch::`` op); ``kernel``: its
    C++ kernel's name, or ``python_kernel``; ``wrapper``: its ``engine.HANDLERS`` key; ``copy``:
    ``cast``, ``copy_in``, ``copy_out`` or ``chunk_cat`` (FSDP2's reduce-scatter copy-in)."""

    id: str
    intercepted: bool
    kernel: str
    wrapper: str
    copy: str
    schema: str

    @property
    def qualified(self) -> str:
        """``"aten::add.Tensor"``, ``"fsdp::chunk_cat"``: the name with its overload."""
        return self.schema.split("(", 1)[0]

    @property
    def name(self) -> str:
        """``"aten::add"``: the name without its overload."""
        return self.qualified.split(".", 1)[0]

    @property
    def overload(self) -> str:
        """``"Tensor"``, or ``""`` for the default overload."""
        return self.qualified.partition(".")[2]

    @property
    def namespace(self) -> str:
        return self.name.split("::", 1)[0]

    @property
    def op_name(self) -> str:
        """``"add"``: the name inside its namespace, without the overload."""
        return self.name.split("::", 1)[1]

    @property
    def counted(self) -> str:
        """``"aten.add.Tensor"``, ``"fsdp.chunk_cat"``: the name stats count it under
        (``str(op)`` of its OpOverload, without ``".default"``)."""
        return self.qualified.replace("::", ".", 1)

    @property
    def definition(self) -> str:
        """The schema without its namespace, as ``torch.library.Library.define`` takes it."""
        return self.schema.split("::", 1)[1]


@functools.cache
def rows() -> tuple[OwnedOp, ...]:
    """Every owned op, in the file's order (C++'s CountedOp order)."""
    src = _build.source_dir(Path(__file__).resolve().parent)
    if src is None:
        raise RuntimeError("npu_dispatch: csrc/dispatch/owned_ops.h not found beside the package")
    text = (src / "dispatch" / "owned_ops.h").read_text()
    found = tuple(OwnedOp(m[2], m[1] == "STOCK", m[3], m[4], m[5], m[6]) for m in _ROW.finditer(text))
    lines = sum(1 for line in text.splitlines() if line.startswith("NPU_DISPATCH_"))
    if not found or len(found) != lines:
        raise RuntimeError(f"npu_dispatch: {lines} rows in {src / 'dispatch' / 'owned_ops.h'}, {len(found)} of the "
                           "one-line form NPU_DISPATCH_<STOCK|LIBRARY>_OP(id, kernel, wrapper, copy, \"schema\")")
    return found
