"""The benchmark suite of issue 3: ``python -m npu_dispatch.bench [--quick] [--only ...] [--json] [--out DIR]``.

Modules: ``workloads`` (the cases, as data), ``timing`` (interleaved ``torch.utils.benchmark``
timing), ``suite`` (bitwise check, variants, metrics, targets), ``machine`` (environment and
native-extension status), ``report`` (tables, markdown, chart), ``workers`` (each workload in
fresh worker processes, merged). Times are microseconds.
"""
