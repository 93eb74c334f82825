"""Builds the C++ extensions at install time against the torch already installed.

``pip install --no-build-isolation .`` (or ``-e .``) compiles ``csrc/`` into ``npu_dispatch/_C``
and ``csrc/emulated_npu/`` into ``npu_dispatch/testing/_emulated_npu_C`` (the emulated Ascend
device) with ``torch.utils.cpp_extension`` (``npu_dispatch/_build.py`` describes both), printing
its progress (``pip install -v`` shows it). Without torch in the build environment
(pip's default build isolation), without a compiler, or when the build fails, the package still
installs: it then builds the extension at first use, or runs every copy as stock
(``python -m npu_dispatch doctor`` says which, and why).

A package built with the extension is built for one torch: its version carries that torch as a
local label (``0.1.0+torch2.13.0.cpu``), so a wheel's name says which torch its prebuilt
libraries are for (``pip wheel --no-build-isolation --no-deps .``). The loader never imports a
library built for another torch (``npu_dispatch/_loader.py``). An sdist, or a build without
torch or with ``NPU_DISPATCH_NATIVE=0``, has the plain version.
"""
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_npu_dispatch_build", HERE / "npu_dispatch" / "_build.py")
build = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = build  # dataclasses look their module up there
_spec.loader.exec_module(build)


def _say(msg: str) -> None:
    print(f"npu_dispatch: {msg}", file=sys.stderr, flush=True)


def _version(torch_version: str | None) -> str:
    """npu_dispatch.__version__, with ``+torch<torch_version>`` (PEP 440 local label: its ``+``
    and any other separator become ``.``) when the package is built for that torch."""
    text = (HERE / "npu_dispatch" / "__init__.py").read_text()
    base = re.search(r'^__version__ = "([^"]+)"$', text, re.M).group(1)
    if torch_version is None:
        return base
    return f"{base}+torch{re.sub(r'[^0-9A-Za-z.]+', '.', torch_version)}"


def _extension():
    """(ext_modules, cmdclass, the torch version built for or None)."""
    if os.environ.get("NPU_DISPATCH_NATIVE", "1") == "0":
        _say("NPU_DISPATCH_NATIVE=0: installing without the C++ extension")
        return [], {}, None
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        _say("torch is not importable in this build environment (pip's build isolation): the C++ "
             "extension will build at first use; install with --no-build-isolation to build it now")
        return [], {}, None
    src = HERE / "csrc"
    by_name = {ext.name: ext for ext in build.EXTENSIONS}

    class OptionalBuild(BuildExtension):
        """Builds each extension (ninja, its steps shown as [k/n]) and writes what it was built
        from beside it; reuses the library an earlier install left in the source tree when it was
        built from the same sources for the same torch (a second `pip install -e` in the checkout
        compiles nothing); a failed build leaves the package without it (the first use says why)."""

        def build_extension(self, ext):
            spec = by_name[ext.name]
            info = spec.note_for(src, torch)
            built = Path(self.get_ext_fullpath(ext.name))
            in_tree = HERE / "npu_dispatch" / spec.package / built.name
            note = in_tree.parent / spec.note
            if in_tree.is_file() and spec.why_stale(note, src, torch) is None:
                if built.resolve() != in_tree.resolve():
                    built.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(in_tree, built)
                    (built.parent / spec.note).write_text(json.dumps(info))
                _say(f"{ext.name}: reusing the build in {in_tree.parent} (same sources, flags and torch {torch.__version__})")
                return
            _say(f"building {ext.name} for torch {torch.__version__} ({len(ext.sources)} files)")
            start = time.perf_counter()
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001  reported, and the install goes on
                _say(f"{ext.name} did not build ({type(e).__name__}: {e}); installing without it")
                return
            (built.parent / spec.note).write_text(json.dumps(info))
            if self.inplace or getattr(self, "editable_mode", False):
                # An editable install copies the library into the source tree: the note goes there too.
                note.write_text(json.dumps(info))
            _say(f"built {built.name} in {time.perf_counter() - start:.0f} s")

        def copy_extensions_to_source(self):
            # `build_ext --inplace` builds under build/ and copies each library into the tree: its
            # note goes with it.
            super().copy_extensions_to_source()
            for ext in self.extensions:
                spec = by_name[ext.name]
                note = (Path(self.build_lib) / self.get_ext_filename(ext.name)).parent / spec.note
                if note.is_file():
                    shutil.copyfile(note, HERE / "npu_dispatch" / spec.package / spec.note)

    exts = [
        CppExtension(
            spec.name,
            optional=True,  # setuptools skips a failed optional build, also when copying an editable one
            sources=[str(p.relative_to(HERE)) for p in spec.sources(src)],
            include_dirs=spec.include_dirs(src),
            extra_compile_args=spec.compile_args(torch),
            extra_link_args=spec.link_args(torch),
        )
        for spec in build.EXTENSIONS
    ]
    return exts, {"build_ext": OptionalBuild.with_options(use_ninja=True)}, torch.__version__


ext_modules, cmdclass, built_for = _extension()
# An sdist holds sources only, for any torch.
setup(version=_version(None if "sdist" in sys.argv else built_for), ext_modules=ext_modules, cmdclass=cmdclass)
