"""The GGUF header reader against the `gguf` package's own reader (the oracle): the same metadata
and the same tensor bytes, read several times faster (a worker reads the header before it
registers; the package's reader took 3.5 s of SmolLM2's time to READY)."""

from __future__ import annotations

import time

import gguf
import numpy as np
import pytest
from intentserve.worker.model.gguf_header import read_gguf_header

from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_gguf


def _assert_same(path) -> None:
    oracle = gguf.GGUFReader(path)
    header = read_gguf_header(path)
    expected = {k: f.contents() for k, f in oracle.fields.items() if not k.startswith("GGUF.")}
    assert header.metadata == expected
    assert [t.name for t in header.tensors] == [t.name for t in oracle.tensors]
    for ours, theirs in zip(header.tensors, oracle.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape
        assert np.array_equal(ours.data, theirs.data)


def test_a_tiny_file_reads_as_the_gguf_package_reads_it(tmp_path):
    config = tiny_config()
    _assert_same(write_gguf(tmp_path / "tiny.gguf", config, random_hf_weights(config)))


@pytest.mark.model
def test_smollm2_reads_as_the_gguf_package_reads_it_and_several_times_faster(smollm2_path):
    _assert_same(smollm2_path)
    started = time.perf_counter()
    gguf.GGUFReader(smollm2_path)
    theirs_s = time.perf_counter() - started
    started = time.perf_counter()
    read_gguf_header(smollm2_path)
    ours_s = time.perf_counter() - started
    assert ours_s * 5 < theirs_s, (ours_s, theirs_s)
