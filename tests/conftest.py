import os
import sys

import torch
import torch.distributed.fsdp  # noqa: F401  registers fsdp::all_gather_copy_in, the stock reference
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

# CI: a fixed example sequence, so a red run is reproducible and a green one is not luck.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


# A test module may define start_early(names) (and stop_early()): once collection is done, it is
# called with the names of the module's selected tests, so slow work of theirs (test_python_path's
# child pytests) can start right away and run beside the rest of the suite; stop_early() at the end
# of the session ends whatever was never waited for.
_EARLY: list = []


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    selected: dict = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "start_early"):
            selected.setdefault(module, []).append(item.originalname)
    for module, names in selected.items():
        _EARLY.append(module)
        module.start_early(names)


def pytest_sessionfinish(session):
    for module in _EARLY:
        if hasattr(module, "stop_early"):
            module.stop_early()
