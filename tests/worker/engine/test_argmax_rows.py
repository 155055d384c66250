"""The sampler's two-pass argmax gives exactly torch.argmax's answer, ties and NaN included."""

import pytest
import torch
from intentserve.worker.engine.sampler import argmax_rows, max_and_argmax_rows


@pytest.mark.parametrize("vocab", [49152, 49152 + 37, 5000, 100])
def test_matches_torch_argmax_on_random_rows(vocab):
    logits = torch.randn(33, vocab, generator=torch.Generator().manual_seed(vocab))
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))


def test_ties_go_to_the_lowest_index_across_chunks_and_the_tail():
    logits = torch.zeros(4, 10 * 1024 + 5)
    logits[0, [7, 3000]] = 5.0  # two chunks hold the maximum: the first wins
    logits[1, [1500, 1501]] = 5.0  # within a chunk: the first wins
    logits[2, [2048, 10 * 1024 + 2]] = 5.0  # a chunk and the tail tie: the chunk wins
    logits[3, 10 * 1024 + 4] = 5.0  # the maximum only in the tail
    assert argmax_rows(logits).tolist() == [7, 1500, 2048, 10 * 1024 + 4]
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))


def test_nan_is_the_maximum_as_in_torch():
    logits = torch.randn(3, 8 * 1024 + 9)
    logits[0, 5000] = float("nan")
    logits[1, 8 * 1024 + 3] = float("nan")  # only in the tail
    logits[2, [100, 8 * 1024 + 1]] = float("nan")  # in a chunk and in the tail: the first
    assert argmax_rows(logits).tolist() == [5000, 8 * 1024 + 3, 100]
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))


def test_bfloat16_and_non_contiguous_rows():
    logits = torch.randn(8, 6000, dtype=torch.bfloat16)
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
    strided = torch.randn(6000, 8).t()  # not contiguous: falls back to torch.argmax
    assert torch.equal(argmax_rows(strided), strided.argmax(dim=-1))


@pytest.mark.parametrize("vocab", [49152, 49152 + 37, 100])
def test_the_row_maximum_comes_with_the_argmax_nan_and_inf_included(vocab):
    """The sampler's non-finite check reads these maxima: they must be amax's, NaN and +-inf
    included, wherever in the row (a chunk or the tail) the extreme value sits."""
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab))
    logits[1, vocab - 1] = float("nan")  # the tail, or the last chunk
    logits[2, 3] = float("inf")
    logits[3, vocab - 2] = float("inf")
    logits[4, :] = float("-inf")  # nothing finite
    logits[5, [10, vocab - 1]] = float("nan")
    row_max, index = max_and_argmax_rows(logits)
    torch.testing.assert_close(row_max, logits.amax(dim=-1), equal_nan=True)
    assert torch.equal(index, logits.argmax(dim=-1))
