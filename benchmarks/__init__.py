"""The benchmark suite (issues 3 and 17): ``python -m benchmarks [--quick] [--only ...] [--json] [--out DIR]``.

Modules: ``workloads`` (the cases, as data), ``timing`` (interleaved ``torch.utils.benchmark``
timing), ``suite`` (bitwise check, variants, metrics, targets, the FSDP2 example's run), ``machine`` (environment and
native-extension status), ``report`` (tables, markdown, chart), ``workers`` (each workload in
fresh worker processes, merged). Times are microseconds.
"""
