"""FSDP2 trained on 2 ranks of the emulated Ascend device (examples/fsdp_train.py --device npu
--emulate), stock and under the mode: bitwise equal after every step (losses, gradients,
parameters), both copy ops on the fast path, and the launches op-plugin's rules give."""
from __future__ import annotations

import json
import os
import sys

import pytest

from npu_dispatch.testing import emulated_npu
from cases import RS_COPY_IN, run_side_by_side

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "fsdp_train.py")


@pytest.fixture(scope="module", autouse=True)
def emulated():
    ok, why = emulated_npu.available()
    if not ok:
        if os.environ.get("NPU_DISPATCH_REQUIRE_NATIVE") == "1":
            pytest.fail(f"the emulated npu must build in CI: {why}")
        pytest.skip(f"no emulated npu here: {why}")


CANNS = ["8.0.RC3", "9.1.0"]


@pytest.fixture(scope="module")
def trained(emulated, tmp_path_factory):
    """``{cann: (returncode, stdout, stderr)}``: the example's run for each CANN version, all started
    at once (each is a parent and two ranks, which leave cores idle at times), so the module takes
    less than their sum."""
    commands = {cann: [sys.executable, EXAMPLE, "--device", "npu", "--emulate", "--cann", cann, "--steps", "3",
                       "--json"] for cann in CANNS}
    done = run_side_by_side(commands, tmp_path_factory.mktemp("npu_fsdp"), timeout=900)
    return {cann: (p.returncode, p.stdout, p.stderr) for cann, p in done.items()}


def _train(trained, cann: str) -> dict:
    returncode, stdout, stderr = trained[cann]
    assert returncode == 0, f"--cann {cann}: {stderr[-3000:]}"
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("cann", CANNS)
def test_fsdp2_on_the_emulated_npu_is_bitwise_equal_and_casts_in_fewer_launches(trained, cann):
    r = _train(trained, cann)
    assert r["device"] == "npu" and r["cann"] == cann
    assert r["bitwise_equal"] is True
    assert r["grads_equal_every_step"] is True and r["params_equal_every_step"] is True
    by_op = r["fast_path_calls_by_op"]
    assert by_op["aten._foreach_copy_"] > 0 and by_op["fsdp.all_gather_copy_in"] > 0
    assert by_op["fsdp.split_with_sizes_copy"] == r["calls_by_op"]["fsdp.split_with_sizes_copy"] > 0
    # chunk_cat on a device stays the device's own op (one call): its only fallback reason.
    assert by_op[RS_COPY_IN] == 0 and set(r["fallback_reasons"]) == {"device_op"}
    assert r["fallback_calls"] == r["calls_by_op"][RS_COPY_IN]
    stock, fast = r["launches_stock"], r["launches_fast"]
    gathers = r["launch_counted_calls"]["copy_in"]
    assert gathers > 0 and r["launch_counted_calls"]["cast"] == gathers
    assert sum(fast["copy_out"].values()) < sum(stock["copy_out"].values())
    assert fast["chunk_cat"] == stock["chunk_cat"]
    # Each all-gather group of the example holds at most 48 shards: cast + copy-in <= 1 + 2 launches.
    fast_cast_and_copy_in = sum(fast["cast"].values()) + sum(fast["copy_in"].values())
    assert fast_cast_and_copy_in <= 3 * gathers
    stock_cast = sum(stock["cast"].values())
    if cann.startswith("9.1"):
        assert stock["cast"] == {"aclnnForeachCopy": gathers}
    else:
        assert stock["cast"] == {"copy": stock_cast} and stock_cast > gathers  # one copy per shard
        assert sum(fast["cast"].values()) == 2 * gathers  # staged: one batched copy, one flat cast
