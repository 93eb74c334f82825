"""A wheel of the checkout (``pip wheel --no-build-isolation --no-deps .``), built from the
install-time build already in the source tree: it carries the prebuilt libraries with their build
notes and the C++ sources, its version names the torch it was built for, and, unpacked beside this
torch in a child process, its library is imported as is (nothing compiled: the child's CXX points
nowhere and its TORCH_EXTENSIONS_DIR stays empty) and serves a copy bitwise stock's. With its note
saying another torch, it is never imported: the warning names both torches and the mode gives
stock's results.

Skipped where the source tree holds no matching install-time build (the package was built at
first use, or for another torch): the wheel would compile, which this test must not wait for.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

import npu_dispatch
from npu_dispatch import _build, _loader

ROOT = Path(__file__).resolve().parent.parent
_WHY_NOT = next((f"{ext.name}: {why}" for ext in _build.EXTENSIONS
                 if (why := _loader.installed_matches(ext)) is not None), None)
pytestmark = [
    pytest.mark.skipif(not (ROOT / "setup.py").is_file() or Path(npu_dispatch.__file__).resolve().parent != ROOT / "npu_dispatch",
                       reason="npu_dispatch is not imported from this source checkout"),
    pytest.mark.skipif(_WHY_NOT is not None, reason=f"no install-time build in the source tree to package ({_WHY_NOT})"),
]

# The child: imports npu_dispatch from sys.argv[1], copies 40 fp32 shards into bf16 views of one
# flat buffer, stock and under the mode, and prints what it saw as JSON.
CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    import npu_dispatch as nd
    from npu_dispatch import _build, _loader, _native

    def make():
        gen = torch.Generator().manual_seed(0)
        srcs = [torch.randn(17 + k, generator=gen) for k in range(40)]
        flat = torch.zeros(sum(s.numel() for s in srcs), dtype=torch.bfloat16)
        return list(flat.split([s.numel() for s in srcs])), srcs, flat

    dsts, srcs, stock = make()
    torch._foreach_copy_(dsts, srcs)
    dsts, srcs, ours = make()
    mode = nd.NpuFastCopyMode()
    with mode:
        torch._foreach_copy_(dsts, srcs)
    print(json.dumps({
        "file": nd.__file__,
        "same": bool(torch.equal(stock.view(torch.int16), ours.view(torch.int16))),
        "fast_path_calls": mode.stats.fast_path_calls,
        "fallback_reasons": dict(mode.stats.fallback_reasons),
        "native": _native.status(),
        "installed": _loader.installed_matches(_build.LIBRARY),
        "imported_installed": "npu_dispatch._C" in sys.modules,
    }))
""")


def _checkout_copy(dest: Path) -> Path:
    """What setup.py builds from (sources, package, in-tree libraries and notes), copied: the
    wheel's build writes build/ and *.egg-info there, not into the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("csrc", "lowerings"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    # npu_dispatch/lowerings may be a link to ../lowerings in a checkout: the package maps it there.
    shutil.copytree(ROOT / "npu_dispatch", dest / "npu_dispatch", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "lowerings"))
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = _checkout_copy(tmp_path_factory.mktemp("checkout"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
                           "--no-cache-dir", "-w", str(tmp), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Built from the tree's libraries, nothing compiled.
    assert "building npu_dispatch" not in proc.stderr, proc.stderr[-3000:]
    wheels = list(tmp.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _child(site: Path, tmp: Path) -> tuple[dict, str]:
    exts = tmp / "torch_extensions"
    exts.mkdir()
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(exts), CXX=str(tmp / "no-compiler"))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(site)], capture_output=True, text=True, env=env,
                          cwd=tmp, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not any(exts.iterdir()), "a first-use build was tried"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_wheel_names_its_torch_and_carries_the_prebuilt_libraries_notes_and_sources(wheel):
    label = re.sub(r"[^0-9A-Za-z.]+", ".", torch.__version__)
    assert wheel.name.startswith(f"npu_dispatch-{npu_dispatch.__version__}+torch{label}-"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        for ext in _build.EXTENSIONS:
            folder = "/".join(["npu_dispatch", *filter(None, [ext.package])])
            short = ext.name.rsplit(".", 1)[1]
            assert any(re.fullmatch(rf"{folder}/{short}\.[^/]*\.so", n) for n in names), (ext.name, names)
            note = json.loads(z.read(f"{folder}/{ext.note}"))
            assert note["torch"] == torch.__version__
            # Portable across installs of this torch: its folder is never named.
            assert str(Path(torch.__file__).parent) not in note["flags"], note["flags"]
            assert note == ext.note_for(_loader.source_dir(), torch)
        assert {n for n in names if n.startswith("npu_dispatch/csrc/")} >= {
            f"npu_dispatch/csrc/{p.relative_to(ROOT / 'csrc')}" for p in (ROOT / "csrc").rglob("*") if p.suffix in (".cpp", ".h")}


def test_the_unpacked_wheel_is_loaded_as_is_and_serves_a_copy_bitwise_stock(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    seen, err = _child(site, tmp_path)
    assert Path(seen["file"]).resolve().parent == site / "npu_dispatch", seen["file"]
    assert seen["installed"] is None, seen["installed"]
    assert seen["native"][0] and "built at install" in seen["native"][1], seen["native"]
    assert seen["same"] and seen["fast_path_calls"] == 1 and seen["fallback_reasons"] == {}, seen
    assert "building" not in err, err


def test_a_wheel_for_another_torch_is_never_loaded_says_so_and_gives_stocks_results(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    for ext in _build.EXTENSIONS:
        note = site / "npu_dispatch" / ext.package / ext.note
        info = json.loads(note.read_text())
        note.write_text(json.dumps({**info, "torch": "2.0.0+other"}))
    seen, err = _child(site, tmp_path)
    said = f"npu_dispatch._C installed was built for torch 2.0.0+other and this is torch {torch.__version__}"
    assert seen["installed"] is not None and said in seen["installed"] and said in err, (seen["installed"], err)
    assert not seen["native"][0] and not seen["imported_installed"], seen
    assert seen["same"] and seen["fast_path_calls"] == 0 and seen["fallback_reasons"], seen
