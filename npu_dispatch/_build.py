"""How the C++ extension is built: one description for the install-time build (``setup.py``, with
``pip install --no-build-isolation``) and the first-use build (``_native.py``, through
``torch.utils.cpp_extension.load``). Imports nothing at module level, so ``setup.py`` can load it
by path before torch is known to be importable."""
from __future__ import annotations

import hashlib
from pathlib import Path

# -fvisibility=hidden: the extension exports its module init only.
CFLAGS = ["-O3", "-Wno-psabi", "-fvisibility=hidden", "-fvisibility-inlines-hidden"]
# The name of the extension an install builds, inside the package (npu_dispatch/_C*.so), and the
# file beside it that says which sources and torch it was built from.
EXTENSION = "npu_dispatch._C"
BUILD_INFO = "_C_build.json"


# The emulated Ascend device (npu_dispatch.testing.emulated_npu): its own extension, from
# csrc/emulated_npu, built the same way, with its build note beside it in npu_dispatch/testing.
EMULATED_NPU_EXTENSION = "npu_dispatch.testing._emulated_npu_C"
EMULATED_NPU_BUILD_INFO = "_emulated_npu_C_build.json"
EMULATED_NPU_CFLAGS = ["-O2", "-Wno-psabi"]


def emulated_npu_sources(src: Path) -> list[Path]:
    return sorted((src / "emulated_npu").glob("*.cpp"))


def source_dir(package_dir: Path) -> Path | None:
    """``csrc/`` of an installed package (``npu_dispatch/csrc``) or of a source checkout."""
    for cand in (package_dir / "csrc", package_dir.parent / "csrc"):
        if any(cand.glob("*.cpp")):
            return cand
    return None


def sources(src: Path) -> list[Path]:
    return sorted(src.glob("*.cpp"))


def source_hash(src: Path) -> str:
    """A digest of every C++ source and header: an install-time build is used only while it
    matches the sources next to the package."""
    h = hashlib.sha1()
    for f in sorted([*src.glob("*.cpp"), *src.glob("*.h")]):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


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
