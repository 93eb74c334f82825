"""Builds the C++ extensions at install time against the torch already installed.

``pip install --no-build-isolation .`` (or ``-e .``) compiles ``csrc/`` into ``npu_dispatch/_C``
and ``csrc/emulated_npu/`` into ``npu_dispatch/testing/_emulated_npu_C`` (the emulated Ascend
device) with ``torch.utils.cpp_extension``, printing its progress. Without torch in the build environment
(pip's default build isolation), without a compiler, or when the build fails, the package still
installs: it then builds the extension at first use, or runs every copy as stock
(``python -m npu_dispatch doctor`` says which, and why).
"""
import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_npu_dispatch_build", HERE / "npu_dispatch" / "_build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)


def _say(msg: str) -> None:
    print(f"npu_dispatch: {msg}", file=sys.stderr, flush=True)


def _extension():
    if os.environ.get("NPU_DISPATCH_NATIVE", "1") == "0":
        _say("NPU_DISPATCH_NATIVE=0: installing without the C++ extension")
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        _say("torch is not importable in this build environment (pip's build isolation): the C++ "
             "extension will build at first use; install with --no-build-isolation to build it now")
        return [], {}
    src = HERE / "csrc"
    omp_cflags, omp_ldflags = build.openmp_flags(torch)
    # Per extension: the note written beside it, where an editable install keeps it, and its text.
    notes = {
        build.EXTENSION: (build.BUILD_INFO, HERE / "npu_dispatch",
                          {"source_hash": build.source_hash(src), "torch": torch.__version__}),
        build.EMULATED_NPU_EXTENSION: (build.EMULATED_NPU_BUILD_INFO, HERE / "npu_dispatch" / "testing",
                                       {"source_hash": build.source_hash(src / "emulated_npu"),
                                        "torch": torch.__version__}),
    }

    class OptionalBuild(BuildExtension):
        """Builds each extension and writes what it was built from beside it; a failed build
        leaves the package without it (the first use says why)."""

        def build_extension(self, ext):
            note, editable_dir, info = notes[ext.name]
            _say(f"building {ext.name} for torch {torch.__version__}")
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001  reported, and the install goes on
                _say(f"{ext.name} did not build ({type(e).__name__}: {e}); installing without it")
                return
            built = Path(self.get_ext_fullpath(ext.name))
            (built.parent / note).write_text(json.dumps(info))
            if self.inplace or getattr(self, "editable_mode", False):
                # An editable install copies the library into the source tree: the note goes there too.
                (editable_dir / note).write_text(json.dumps(info))
            _say(f"built {built.name}")

    exts = [
        CppExtension(
            build.EXTENSION,
            optional=True,  # setuptools skips a failed optional build, also when copying an editable one
            sources=[str(p.relative_to(HERE)) for p in build.sources(src)],
            extra_compile_args=build.CFLAGS + omp_cflags,
            extra_link_args=omp_ldflags,
        ),
        CppExtension(
            build.EMULATED_NPU_EXTENSION,
            optional=True,
            sources=[str(p.relative_to(HERE)) for p in build.emulated_npu_sources(src)],
            extra_compile_args=build.EMULATED_NPU_CFLAGS,
        ),
    ]
    return exts, {"build_ext": OptionalBuild.with_options(use_ninja=True)}


ext_modules, cmdclass = _extension()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
