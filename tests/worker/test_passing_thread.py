"""Torch work before serving runs on a thread that ends, taking its OpenMP team with it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from intentserve.worker.runtime.threads import on_passing_thread


def test_the_value_and_the_error_come_back_to_the_caller():
    assert on_passing_thread(lambda x, y: x + y, 2, 3) == 5
    with pytest.raises(ValueError, match="bad"):
        on_passing_thread(lambda: (_ for _ in ()).throw(ValueError("bad")))


# In a fresh interpreter: in the suite's process, threads that other tests left behind (gRPC
# pollers, Ray, timers) come and go and would be counted with the OpenMP team.
_COUNT_TEAMS = """
import os, threading, time, torch
from intentserve.worker.runtime.threads import on_passing_thread

def count():
    return len(os.listdir("/proc/self/task"))

def settles_at(n, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while count() != n and time.monotonic() < deadline:
        time.sleep(0.01)
    return count()

def parallel_matmul():
    a = torch.randn(512, 512)
    return float((a @ a).sum())  # a parallel op: this thread gets an OpenMP team

torch.set_num_threads(2)
parallel_matmul()  # the main thread's own team, before counting
before = count()
on_passing_thread(parallel_matmul)
passing = settles_at(before)
done = threading.Event()
stay = threading.Thread(target=lambda: (parallel_matmul(), done.wait(10)))
stay.start()
staying = settles_at(before + 2)
time.sleep(0.2)
still = count()
done.set()
stay.join()
print(before, passing, staying, still)
"""


@pytest.mark.integration
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_parallel_op_leaves_no_openmp_threads_behind():
    out = subprocess.run(
        [sys.executable, "-c", _COUNT_TEAMS], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    before, passing, staying, still = map(int, out.stdout.split())
    assert passing == before  # the passing thread took its team with it
    # The contrast: a thread that lives on keeps its team (one thread more per extra core).
    assert staying == before + 2
    assert still == before + 2
