"""Command line: ``python -m npu_dispatch doctor|build`` (benchmarks: ``python -m benchmarks``)."""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    # Also installed as the `npu-dispatch` command (pyproject [project.scripts]).
    p = argparse.ArgumentParser(prog="python -m npu_dispatch (or npu-dispatch)")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("doctor", help="versions, devices, native build and capability table")
    sub.add_parser("build", help="build (or load the cached) C++ extension now, not on first use")
    args = p.parse_args(argv)
    if args.cmd == "doctor":
        from .doctor import report

        print(report())
        return 0
    from . import _native

    _native.build()
    built, reason = _native.status()
    print(reason)
    return 0 if built else 1


if __name__ == "__main__":
    sys.exit(main())
