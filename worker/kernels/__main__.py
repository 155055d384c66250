"""`python -m intentserve.worker.kernels [--build [--jobs N]]`: the kernels' cache.

Without `--build` it says, per kernel, whether this host would find it built; with `--build` it
compiles what is missing, N compilers at a time, and loads each kernel, as a worker would (an image
runs this at build time, with INTENTSERVE_KERNEL_CACHE and INTENTSERVE_KERNEL_MARCH set as its
workers see them). Exit 1 when a kernel cannot be had, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from intentserve.worker.kernels import library
from intentserve.worker.kernels.library import KernelUnavailable
from intentserve.worker.kernels.table import KERNEL_NAMES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m intentserve.worker.kernels",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument("--build", action="store_true", help="compile and load every kernel")
    parser.add_argument(
        "--jobs",
        type=_positive,
        default=os.cpu_count() or 1,
        metavar="N",
        help="with --build: compilers run at once (default: this host's CPUs)",
    )
    args = parser.parse_args(argv)
    march = library._march()
    print(f"cache {library._cache_dir()}, -march={march}", flush=True)
    if args.build and args.jobs > 1:
        # The compilers side by side first (each its own process; a failure is kept by the load
        # below, which builds again and says why), then every kernel loaded, in order.
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(_try_build, KERNEL_NAMES))
    failed = 0
    for name in KERNEL_NAMES:
        try:
            path = library.load(name)._name if args.build else library.cached(name)
        except KernelUnavailable as error:
            print(f"{name}: unavailable: {error.reason}")
            failed += 1
            continue
        print(f"{name}: {path or 'not built (run with --build)'}")
    return 1 if failed else 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a whole number >= 1")
    return value


def _try_build(name: str) -> None:
    with contextlib.suppress(KernelUnavailable):  # the load that follows says why
        library.build(name)


if __name__ == "__main__":
    sys.exit(main())
