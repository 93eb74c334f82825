"""The one loader of npu_dispatch's C++ extensions (``_build.LIBRARY``, ``_build.EMULATED_NPU``).

``load(ext)`` imports the library an install built (``pip install --no-build-isolation``, see
``setup.py``) when its build note says it was built from the sources beside the package and for
the torch in use; else it builds one with ``torch.utils.cpp_extension.load`` into
``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), saying so on stderr before and
after a build that has no cached library yet, and later processes reuse the cached build. A stale
install-time build is never imported: its kernels would register beside the fresh build's.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from . import _build

__all__ = ["LoadError", "load", "source_dir", "installed_matches"]

_PACKAGE = Path(__file__).resolve().parent


class LoadError(RuntimeError):
    """Why an extension could not be loaded or built (the message is the reason shown to users)."""


def source_dir() -> Path | None:
    """``csrc/`` beside the package (installed as ``npu_dispatch/csrc``, or a source checkout's)."""
    return _build.source_dir(_PACKAGE)


def load(ext: _build.Extension, verbose: bool = False):
    """``(module, how)``: the extension, installed or built now; raises :class:`LoadError` (no
    sources, no compiler, a failed build). ``verbose``: every compiler step on stdout."""
    src = source_dir()
    module, why_not = _installed(ext, src)
    if module is not None:
        return module, f"{ext.name} (built at install)"
    if src is None or not ext.sources(src):
        raise LoadError(f"C++ sources (csrc/{ext.folder or '*'}) not found next to the package; {why_not}")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise LoadError(f"no C++ compiler: {cxx!r} not found (install one, or set CXX); {why_not}")
    try:
        return _first_use_build(ext, src, verbose, why_not)
    except Exception as e:  # noqa: BLE001  the last line of a compiler error is the useful one
        text = str(e).strip()
        raise LoadError(f"{type(e).__name__}: {text.splitlines()[-1] if text else ''}") from e


def installed_matches(ext: _build.Extension) -> str | None:
    """None where an install-time build of ``ext`` is there and its note matches the sources
    beside the package, the torch in use and the compiler flags; else why not."""
    return _why_not_installed(ext, source_dir())


def _why_not_installed(ext: _build.Extension, src: Path | None) -> str | None:
    return ext.why_stale(_PACKAGE / ext.package / ext.note, src, torch)


def _installed(ext: _build.Extension, src: Path | None):
    """``(module, None)`` for a matching install-time build, else ``(None, why not)``."""
    why = _why_not_installed(ext, src)
    if why is not None:
        return None, why
    try:
        return importlib.import_module(ext.name), None
    except ImportError as e:
        return None, f"the extension installed does not load: {e}"


def _first_use_build(ext: _build.Extension, src: Path, verbose: bool, why_not: str):
    """Builds (or takes from TORCH_EXTENSIONS_DIR) ``ext`` for the torch in use; ``why_not``: why
    no install-time build was taken, said on stderr with the build."""
    from torch.utils import cpp_extension

    # One cache entry per source tree and torch build: two checkouts (or venvs) sharing
    # TORCH_EXTENSIONS_DIR would otherwise rebuild over each other on every load.
    key = f"{src.resolve()}|{torch.__version__}|{torch.__file__}".encode()
    name = f"{ext.name.replace('.', '_')}_{hashlib.sha1(key).hexdigest()[:10]}"
    cached = Path(cpp_extension._get_build_directory(name, verbose=False)) / f"{name}.so"
    fresh = not cached.is_file()
    if fresh:
        if why_not != _build.NOT_BUILT:
            print(f"npu_dispatch: {why_not}", file=sys.stderr, flush=True)
        print(f"npu_dispatch: building {ext.name} for torch {torch.__version__} now (first use; "
              "`pip install --no-build-isolation .` builds it at install)", file=sys.stderr, flush=True)
    start = time.perf_counter()
    module = cpp_extension.load(
        name=name,
        sources=[str(p) for p in ext.sources(src)],
        extra_cflags=ext.compile_args(torch),
        extra_ldflags=ext.link_args(torch),
        extra_include_paths=ext.include_dirs(src),
        is_python_module=True,
        verbose=verbose,
    )
    if fresh:
        print(f"npu_dispatch: built {ext.name} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return module, name
