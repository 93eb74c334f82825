"""The main job: FSDP2 training (2 gloo ranks) stock and under the mode, compared bitwise."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "fsdp_train.py")


@pytest.mark.parametrize("front", [False, True], ids=["mode", "mode_front"])
def test_fsdp2_training_is_bitwise_equal_and_takes_the_fast_path(front):
    proc = subprocess.run(
        [sys.executable, EXAMPLE, "--steps", "3", "--world-size", "2", "--json"] + (["--front"] if front else []),
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["steps"] == 3 and result["world_size"] == 2
    assert len(result["losses_stock"]) == 3
    assert result["losses_stock"] == result["losses_fast"]
    assert result["bitwise_equal"] is True
    by_op = result["fast_path_calls_by_op"]
    assert by_op["aten._foreach_copy_"] > 0 and by_op["fsdp.all_gather_copy_in"] > 0
    assert result["fallback_calls"] == 0
    # FSDP's copy-in of adjacent bf16 splits is one flat copy per all-gather.
    assert result["paths"]["coalesced"]["calls"] == by_op["fsdp.all_gather_copy_in"]
