"""`python -m intentserve.worker.kernels [--build [--all-variants] [--jobs N]]`: the kernels' cache.

Without `--build` it says, per kernel, whether this process would find it built for the variant
it loads; with `--build` it compiles what is missing, N compilers at a time, and loads each kernel,
as a worker would. `--all-variants` compiles every portable variant too (runnable here or not), so
that any host finds its own: an image runs this at build time, with INTENTSERVE_KERNEL_CACHE set
as its workers see it. Exit 1 when a kernel cannot be had, with the reason.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from intentserve.worker.kernels import library, variants
from intentserve.worker.kernels.library import KernelUnavailable
from intentserve.worker.kernels.table import KERNEL_NAMES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m intentserve.worker.kernels",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument("--build", action="store_true", help="compile and load every kernel")
    parser.add_argument(
        "--all-variants",
        action="store_true",
        help="with --build: also compile every portable ISA variant ("
        + ", ".join(v.name for v in variants.PORTABLE)
        + ")",
    )
    parser.add_argument(
        "--jobs",
        type=_positive,
        default=os.cpu_count() or 1,
        metavar="N",
        help="with --build: compilers run at once (default: this host's CPUs)",
    )
    args = parser.parse_args(argv)
    try:
        choice = library.chosen()
    except KernelUnavailable as error:
        print(f"unavailable: {error.reason}")
        return 1
    print(f"cache {library._cache_dir()}, variant {choice.describe()}", flush=True)
    if args.build:
        # The compilers side by side first (each its own process; a failure of the chosen
        # variant's is kept by the load below, which builds again and says why), then every
        # kernel loaded, in order.
        extra = [v for v in variants.PORTABLE if v != choice.variant] if args.all_variants else []
        jobs = [(name, v) for v in (choice.variant, *extra) for name in KERNEL_NAMES]
        with ThreadPoolExecutor(args.jobs) as pool:
            failures = [f for f in pool.map(_try_build, jobs) if f]
        for variant in extra:
            mine = [f for f in failures if f.startswith(f"{variant.name} ")]
            print(f"variant {variant.name}: " + ("; ".join(mine) or "built"))
        failed = sum(1 for f in failures if not f.startswith(f"{choice.variant.name} "))
    else:
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


def _try_build(job: tuple[str, variants.Variant]) -> str:
    """ "" when built, else "<variant> <name>: <why>"."""
    name, variant = job
    try:
        library.build(name, variant)
    except KernelUnavailable as error:
        return f"{variant.name} {name}: {error.reason}"
    return ""


if __name__ == "__main__":
    sys.exit(main())
