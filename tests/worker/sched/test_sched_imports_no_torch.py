"""The schedulers and the block allocator are pure Python: importing them loads no torch."""

from __future__ import annotations

from tests.import_checks import roots_loaded_by

MODULES = [
    "worker.sched.sequence",
    "worker.sched.scheduler",
    "worker.sched.paged_scheduler",
    "worker.sched.default_scheduler",
    "worker.cache.block_allocator",
    "worker.cache.kv_usage",
]


def test_importing_the_schedulers_does_not_import_torch():
    assert roots_loaded_by(MODULES, {"torch"}) == []
