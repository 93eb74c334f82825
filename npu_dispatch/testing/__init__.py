"""Test devices for npu_dispatch: :mod:`npu_dispatch.testing.emulated_npu`, an emulated Ascend NPU
that runs on the host and counts device launches the way op-plugin's kernels issue them."""
