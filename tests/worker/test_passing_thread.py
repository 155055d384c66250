"""Torch work before serving runs on a thread that ends, taking its OpenMP team with it."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from intentserve.worker.runtime.threads import on_passing_thread


def _num_os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _settles_at(num_threads: int, timeout_s: float = 5.0) -> int:
    """The thread count once it reaches `num_threads` (team mates exit just after their master)."""
    deadline = time.monotonic() + timeout_s
    while _num_os_threads() != num_threads and time.monotonic() < deadline:
        time.sleep(0.01)
    return _num_os_threads()


def _parallel_matmul() -> float:
    a = torch.randn(512, 512)
    return float((a @ a).sum())  # a parallel op: this thread gets an OpenMP team


def test_the_value_and_the_error_come_back_to_the_caller():
    assert on_passing_thread(lambda x, y: x + y, 2, 3) == 5
    with pytest.raises(ValueError, match="bad"):
        on_passing_thread(lambda: (_ for _ in ()).throw(ValueError("bad")))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_parallel_op_leaves_no_openmp_threads_behind():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        before = _num_os_threads()
        on_passing_thread(_parallel_matmul)
        assert _settles_at(before) == before
        # The contrast: a thread that lives on keeps its team (one thread more per extra core).
        done = threading.Event()
        stay = threading.Thread(target=lambda: (_parallel_matmul(), done.wait(10)))
        stay.start()
        try:
            assert _settles_at(before + 2) == before + 2  # the thread and its team mate
            time.sleep(0.2)
            assert _num_os_threads() == before + 2  # and they stay
        finally:
            done.set()
            stay.join()
    finally:
        torch.set_num_threads(previous)
