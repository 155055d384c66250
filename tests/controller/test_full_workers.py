"""A router's note of the workers that refused a request as full, on a fake clock: skipped for
FULL_BACKOFF_S, or until one of the router's own requests on the worker ends."""

from intentserve.controller.router.full_workers import FULL_BACKOFF_S, FullWorkers


class Clock:
    def __init__(self) -> None:
        self.now_s = 50.0

    def __call__(self) -> float:
        return self.now_s


def test_a_refusing_worker_is_full_for_the_backoff_then_tried_again():
    clock = Clock()
    full = FullWorkers(clock)
    assert not full.is_full("w0")
    assert full.mark("w0") == FULL_BACKOFF_S
    assert full.is_full("w0") and not full.is_full("w1")
    clock.now_s += FULL_BACKOFF_S * 0.9
    assert full.is_full("w0")
    clock.now_s += FULL_BACKOFF_S * 0.2
    assert not full.is_full("w0")


def test_one_of_its_own_requests_ending_frees_it_at_once():
    full = FullWorkers(Clock())
    full.mark("w0")
    full.clear("w0")
    assert not full.is_full("w0")
