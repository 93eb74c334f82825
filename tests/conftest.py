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
