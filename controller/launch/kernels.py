"""The workers' CPU kernels compiled while Ray starts, where the workers will run on this host.

A worker compiles each C kernel it lacks at first use (worker/attention/cpu_kernels), ~1 s of one
core each, and two workers starting together each compile the same ones: on a 2-core machine the
first `up` was READY ~4 s later than the next. `up` runs the kernels' own build (`python -m
intentserve.worker.attention.cpu_kernels --build`, a process: the controller never imports the
worker) beside Ray's start, and the workers find the libraries in the cache they share with it.
It never fails `up`: a kernel that cannot be had is the worker's to report (its capability says
what it runs without), so here it is only said.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

KERNELS_MODULE = "intentserve.worker.attention.cpu_kernels"
WAIT_S = 120.0  # the build's own limit is 120 s a kernel; past this the workers build their own


@dataclass
class KernelBuild:
    process: subprocess.Popen
    started_s: float

    @classmethod
    def start(cls, command: list[str] | None = None) -> KernelBuild:
        """Start the build (`command`: the kernels' build on this interpreter, every CPU)."""
        jobs = str(os.cpu_count() or 1)
        command = command or [sys.executable, "-m", KERNELS_MODULE, "--build", "--jobs", jobs]
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return cls(process, time.monotonic())

    def stop(self) -> None:
        """`up` is failing before the workers start: the build is not wanted."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()

    def finish(self, timeout_s: float = WAIT_S) -> str:
        """Wait for the build; what it did, in words, for `up`'s progress."""
        try:
            out, _ = self.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            return f"not ready after {timeout_s:g} s, stopped; each worker compiles its own"
        elapsed = time.monotonic() - self.started_s
        lines = out.strip().splitlines()
        cache = next((x.removeprefix("cache ") for x in lines if x.startswith("cache ")), "")
        where = f" (cache {cache})" if cache else ""
        failed = [x for x in lines if ": unavailable: " in x]
        if self.process.returncode == 0:
            return f"ready for this host in {elapsed:.1f} s{where}"
        if failed:
            name, reason = failed[0].split(": unavailable: ", 1)
            more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
            return (
                f"{name}{more} not built here: {reason}; each worker reports what it runs "
                f"without{where}"
            )
        last = lines[-1] if lines else "(no output)"
        return f"the build exited {self.process.returncode}: {last}"
