"""How the C++ extensions are built and loaded: one description for the install-time build
(``setup.py``, with ``pip install --no-build-isolation``) and the first-use build
(``torch.utils.cpp_extension.load``), for both extensions: the library (``csrc/`` but
``csrc/emulated_npu``, into ``npu_dispatch/_C``) and the emulated Ascend device
(``csrc/emulated_npu``, into ``npu_dispatch/testing/_emulated_npu_C``). Imports nothing but the
standard library at module level, so ``setup.py`` can load it by path before torch is importable.

Each install-time build leaves a note beside it (:meth:`Extension.note_for`): the digest of the
sources it was built from, the torch it was built for and its compiler flags. A library is used
only while its note matches, with no version number kept in step by hand; a first-use build is
kept fresh by ``torch.utils.cpp_extension`` itself.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

# -fvisibility=hidden: the extension exports its module init only. -g0: no debug info (setuptools
# passes Python's -g, which only slows the build).
# -Wno-maybe-uninitialized, -Wno-unknown-pragmas: false alarms from GCC's AVX-512 headers and
# torch's `#pragma unroll`, which fill a verbose build's output.
CFLAGS = ["-O3", "-g0", "-Wno-psabi", "-Wno-maybe-uninitialized", "-Wno-unknown-pragmas", "-fvisibility=hidden", "-fvisibility-inlines-hidden"]


# why_stale's reason where no install-time build is there at all.
NOT_BUILT = "no extension was built at install"


@dataclasses.dataclass(frozen=True)
class Extension:
    """One C++ extension: ``name`` (its module inside the package), ``folder`` (under ``csrc/``;
    "" for the library, whose sources are every folder but the emulated device's), ``note`` (the
    file beside the built library naming its sources' digest and torch), ``package`` (the
    package folder, relative to ``npu_dispatch/``, it goes in), ``cflags``, ``openmp``."""

    name: str
    folder: str
    note: str
    package: str
    cflags: tuple[str, ...]
    openmp: bool

    def sources(self, src: Path) -> list[Path]:
        root = src / self.folder if self.folder else src
        return sorted(p for p in root.rglob("*.cpp")
                      if self.folder or "emulated_npu" not in p.relative_to(src).parts)

    def source_hash(self, src: Path) -> str:
        """A digest of every C++ source and header the extension is built from."""
        root = src / self.folder if self.folder else src
        h = hashlib.sha1()
        for f in sorted([*root.rglob("*.cpp"), *root.rglob("*.h")]):
            if not self.folder and "emulated_npu" in f.relative_to(src).parts:
                continue
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
        return h.hexdigest()[:16]

    def include_dirs(self, src: Path) -> list[str]:
        return [str(src / self.folder if self.folder else src)]

    def compile_args(self, torch) -> list[str]:
        omp = openmp_flags(torch)[0] if self.openmp else []
        return [*self.cflags, *omp]

    def link_args(self, torch) -> list[str]:
        return openmp_flags(torch)[1] if self.openmp else []

    def note_for(self, src: Path, torch) -> dict:
        """What a build of this extension from ``src`` for ``torch`` is: the note written beside
        an install-time build (and shipped in a wheel), and compared with before it is used or
        reused. ``flags`` name torch's own folder as ``<torch>``: a library built against one
        install of a torch version matches another install of it (a wheel in a new venv)."""
        root = str(Path(torch.__file__).parent)  # as openmp_flags names it
        flags = " ".join(self.compile_args(torch) + self.link_args(torch)).replace(root, "<torch>")
        return {"source_hash": self.source_hash(src), "torch": torch.__version__, "flags": flags}

    def why_stale(self, note: Path, src: Path | None, torch) -> str | None:
        """None where the build note ``note`` says its library can be used here: built for this
        torch and, where the sources are known (``src``), from them with today's flags; else why
        not. The one check of a note, for setup.py's reuse and the loader's import."""
        if not note.is_file():
            return NOT_BUILT
        try:
            info = json.loads(note.read_text())
        except (OSError, ValueError) as e:
            return f"unreadable {note.name}: {e}"
        if info.get("torch") != torch.__version__:
            # Never imported then: torch's C++ ABI is only kept within one version.
            return (f"the {self.name} installed was built for torch {info.get('torch')} and this is torch "
                    f"{torch.__version__}: a library built for another torch is never loaded")
        if src is None:
            return None
        want = self.note_for(src, torch)
        if info.get("source_hash") != want["source_hash"]:
            return "the extension installed was built from other sources than those next to the package"
        if info.get("flags") != want["flags"]:
            return "the extension installed was built with other compiler flags"
        return None


LIBRARY = Extension("npu_dispatch._C", "", "_C_build.json", "", tuple(CFLAGS), True)
EMULATED_NPU = Extension("npu_dispatch.testing._emulated_npu_C", "emulated_npu", "_emulated_npu_C_build.json",
                         "testing", ("-O2", "-g0", "-Wno-psabi"), False)
EXTENSIONS = (LIBRARY, EMULATED_NPU)


def source_dir(package_dir: Path) -> Path | None:
    """``csrc/`` of an installed package (``npu_dispatch/csrc``) or of a source checkout."""
    for cand in (package_dir / "csrc", package_dir.parent / "csrc"):
        if any(cand.rglob("*.cpp")):
            return cand
    return None


def openmp_flags(torch) -> tuple[list[str], list[str]]:
    """at::parallel_for is inline OpenMP in ATen's headers: without -fopenmp it runs serially.

    Link the libgomp that torch ships (its soname is already loaded by torch, so no second OpenMP
    runtime appears); where a torch with OpenMP ships none, -fopenmp links the compiler's, as
    torch's own extensions do. A torch built without OpenMP gets no flags.
    """
    if "OpenMP" not in torch.__config__.parallel_info():
        return [], []
    gomp = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    return ["-fopenmp"], ([str(gomp)] if gomp.is_file() else ["-fopenmp"])
