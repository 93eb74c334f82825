"""Compile-first FSDP (examples/compiled_fsdp_train.py, 2 gloo ranks, both bucket modes): training
with the lowerings is bitwise stock Inductor's after every step, and the generated code of the
real setup shows the lowerings (no fp32 temporary, no bucketing Python op in the copy-ins)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

if not dist.is_available():
    pytest.skip("torch built without distributed", allow_module_level=True)

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "compiled_fsdp_train.py")


@pytest.fixture(scope="module")
def result():
    proc = subprocess.run([sys.executable, EXAMPLE, "--steps", "3", "--json"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mode(result, name):
    (m,) = [m for m in result["modes"] if m["bucket_mode"] == name]
    return m


@pytest.mark.parametrize("bucket_mode", ["default", "custom_ops"])
def test_training_is_bitwise_stock_inductors_after_every_step(result, bucket_mode):
    m = _mode(result, bucket_mode)
    assert len(m["losses_stock"]) == 3 == result["steps"]
    assert [x.hex() for x in m["losses_stock"]] == [x.hex() for x in m["losses_lowered"]]
    assert m["losses_equal_every_step"] and m["grads_equal_every_step"] and m["params_equal_every_step"]
    assert m["losses_stock"][-1] < m["losses_stock"][0]  # it trains


def test_default_mode_copy_in_loses_its_fp32_temporary(result):
    m = _mode(result, "default")
    stock = [b for b in m["buckets_stock"] if b["collective"] == "all_gather"]
    lowered = [b for b in m["buckets_lowered"] if b["collective"] == "all_gather"]
    assert stock and len(stock) == len(lowered)
    # Stock: one kernel writes a bucket-sized fp32 temporary beside the bf16 bucket.
    assert all(b["kernels"] >= 1 and b["temp_bytes"] > 0 for b in stock)
    assert all(b["kernels"] >= 1 and b["temp_bytes"] == 0 and not b["externs"] for b in lowered)


def test_custom_ops_copies_become_kernels(result):
    m = _mode(result, "custom_ops")
    externs = {"all_gather": ["bucketing::_pre_bucket_all_gather"], "reduce_scatter": ["bucketing::_pre_bucket_reduce_scatter"]}
    assert {b["collective"] for b in m["buckets_stock"]} == {"all_gather", "reduce_scatter"}
    for b in m["buckets_stock"]:
        assert b["externs"] == externs[b["collective"]] and b["kernels"] == 0
    assert len(m["buckets_lowered"]) == len(m["buckets_stock"])
    for b in m["buckets_lowered"]:
        assert not b["externs"] and b["kernels"] >= 1
    assert m["copy_ms_stock"]["all_gather"] > 0 and m["copy_ms_lowered"]["all_gather"] > 0
