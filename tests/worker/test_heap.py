"""A worker's heap once its engine is built: the GGUF parse dropped, the rest frozen out of the
garbage collector's passes (worker/runtime/heap.py)."""

from __future__ import annotations

import gc

import pytest
from intentserve.worker.model import gguf_loader
from intentserve.worker.runtime.heap import settle_heap

from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_gguf


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # the test process goes on collecting as before


def test_the_parse_is_dropped_and_what_remains_is_frozen(tmp_path, unfrozen):
    config = tiny_config()
    path = write_gguf(tmp_path / "tiny.gguf", config, random_hf_weights(config))
    opened = gguf_loader.open_gguf(path)
    assert gguf_loader.open_gguf(path) is opened  # kept parsed between probe and load
    kept = [object()]  # lives on, as the model's modules do
    assert any(o is kept for o in gc.get_objects())

    heap = settle_heap()
    frozen_now = gc.get_freeze_count()

    # NOTE: not equal: a frozen object that dies leaves the count, and threads left running by
    # earlier tests in this process may free some between the two reads.
    assert 0.99 * heap.frozen_objects <= frozen_now <= heap.frozen_objects
    assert frozen_now > 0
    assert gguf_loader.open_gguf(path) is not opened  # parsed afresh: the cache was dropped
    assert not any(o is kept for o in gc.get_objects())  # no longer walked by a collection
    assert heap.seconds >= 0
