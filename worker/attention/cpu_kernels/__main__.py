"""`python -m intentserve.worker.attention.cpu_kernels [--build]`: the CPU kernels' cache.

Without `--build` it says, per kernel, whether this host would find it built; with `--build` it
compiles what is missing and loads each kernel, as a worker would (an image runs this at build
time, with INTENTSERVE_KERNEL_CACHE and INTENTSERVE_KERNEL_MARCH set as its workers see them).
Exit 1 when a kernel cannot be had, with the reason.
"""

from __future__ import annotations

import argparse
import sys

from intentserve.worker.attention import cpu_kernels
from intentserve.worker.attention.cpu_kernels import KERNEL_NAMES, KernelUnavailable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m intentserve.worker.attention.cpu_kernels",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument("--build", action="store_true", help="compile and load every kernel")
    args = parser.parse_args(argv)
    march = cpu_kernels._march()
    print(f"cache {cpu_kernels._cache_dir()}, -march={march}")
    failed = 0
    for name in KERNEL_NAMES:
        try:
            path = cpu_kernels._load(name)._name if args.build else cpu_kernels.cached(name)
        except KernelUnavailable as error:
            print(f"{name}: unavailable: {error.reason}")
            failed += 1
            continue
        print(f"{name}: {path or 'not built (run with --build)'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
