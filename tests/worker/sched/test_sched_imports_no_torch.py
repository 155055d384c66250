"""The schedulers and the block allocator are pure Python: importing them loads no torch."""

from __future__ import annotations

import pytest

from tests.import_checks import parts_loaded_by

pytestmark = pytest.mark.integration  # parts_loaded_by runs a subprocess

MODULES = [
    "intentserve.worker.sched.sequence",
    "intentserve.worker.sched.scheduler",
    "intentserve.worker.sched.paged_scheduler",
    "intentserve.worker.sched.default_scheduler",
    "intentserve.worker.cache.block_allocator",
    "intentserve.worker.cache.kv_usage",
]


def test_importing_the_schedulers_does_not_import_torch():
    assert parts_loaded_by(MODULES, {"torch"}) == []
