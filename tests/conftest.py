import os
import sys

import pytest
import torch
import torch.distributed.fsdp  # noqa: F401  registers fsdp::all_gather_copy_in, the stock reference
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

# CI: a fixed example sequence, so a red run is reproducible and a green one is not luck.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def dispatched(monkeypatch):
    """Counts the calls of aten._foreach_copy_ that reach NpuFastCopyMode's dispatch handler."""
    from npu_dispatch import mode as mode_module

    mode_module._install_handlers()
    op = torch.ops.aten._foreach_copy_.default
    _, inner, name = mode_module._TABLE[id(op)]
    calls = []

    def counting(*a, **k):
        calls.append(1)
        return inner(*a, **k)

    monkeypatch.setitem(mode_module._TABLE, id(op), (op, counting, name))
    return calls
