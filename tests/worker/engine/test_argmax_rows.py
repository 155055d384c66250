"""The sampler's argmax (the compiled kernel, and the two-pass torch ops where it is not built)
gives exactly torch.argmax's answer and amax's maximum, ties and NaN included."""

import shutil

import pytest
import torch
from intentserve.worker.engine import sampler
from intentserve.worker.engine.sampler import max_and_argmax_rows

HAS_CC = any(shutil.which(n) for n in ("cc", "gcc", "clang"))


@pytest.fixture(params=["compiled", "torch ops"])
def compiled(request):
    if request.param == "compiled" and not HAS_CC:
        pytest.skip("no C compiler (cc, gcc or clang) to build the CPU kernels")
    return request.param == "compiled"


def argmax_rows(logits, compiled=True):
    return max_and_argmax_rows(logits, compiled=compiled)[1]


@pytest.mark.parametrize("vocab", [49152, 49152 + 37, 5000, 100])
def test_matches_torch_argmax_on_random_rows(vocab, compiled):
    logits = torch.randn(33, vocab, generator=torch.Generator().manual_seed(vocab))
    assert torch.equal(argmax_rows(logits, compiled), logits.argmax(dim=-1))


def test_ties_go_to_the_lowest_index_across_chunks_and_the_tail(compiled):
    logits = torch.zeros(4, 10 * 1024 + 5)
    logits[0, [7, 3000]] = 5.0  # two chunks hold the maximum: the first wins
    logits[1, [1500, 1501]] = 5.0  # within a chunk: the first wins
    logits[2, [2048, 10 * 1024 + 2]] = 5.0  # a chunk and the tail tie: the chunk wins
    logits[3, 10 * 1024 + 4] = 5.0  # the maximum only in the tail
    assert argmax_rows(logits, compiled).tolist() == [7, 1500, 2048, 10 * 1024 + 4]
    assert torch.equal(argmax_rows(logits, compiled), logits.argmax(dim=-1))


def test_nan_is_the_maximum_as_in_torch(compiled):
    logits = torch.randn(3, 8 * 1024 + 9)
    logits[0, 5000] = float("nan")
    logits[1, 8 * 1024 + 3] = float("nan")  # only in the tail
    logits[2, [100, 8 * 1024 + 1]] = float("nan")  # in a chunk and in the tail: the first
    assert argmax_rows(logits, compiled).tolist() == [5000, 8 * 1024 + 3, 100]
    assert torch.equal(argmax_rows(logits, compiled), logits.argmax(dim=-1))


def test_bfloat16_and_non_contiguous_rows():
    logits = torch.randn(8, 6000, dtype=torch.bfloat16)
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
    strided = torch.randn(6000, 8).t()  # not contiguous: falls back to torch.argmax
    assert torch.equal(argmax_rows(strided), strided.argmax(dim=-1))


@pytest.mark.parametrize("vocab", [49152, 49152 + 37, 100])
def test_the_row_maximum_comes_with_the_argmax_nan_and_inf_included(vocab, compiled):
    """The sampler's non-finite check reads these maxima: they must be amax's, NaN and +-inf
    included, wherever in the row (a chunk or the tail) the extreme value sits."""
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab))
    logits[1, vocab - 1] = float("nan")  # the tail, or the last chunk
    logits[2, 3] = float("inf")
    logits[3, vocab - 2] = float("inf")
    logits[4, :] = float("-inf")  # nothing finite
    logits[5, [10, vocab - 1]] = float("nan")
    row_max, index = max_and_argmax_rows(logits, compiled=compiled)
    torch.testing.assert_close(row_max, logits.amax(dim=-1), equal_nan=True)
    assert torch.equal(index, logits.argmax(dim=-1))


@pytest.mark.skipif(not HAS_CC, reason="no C compiler (cc, gcc or clang) to build the CPU kernels")
def test_the_sampler_uses_the_compiled_kernel_where_it_is_built():
    assert sampler._compiled_max_argmax() is not None


@pytest.mark.parametrize("vocab", [16, 17, 31, 32, 33, 47, 48, 49, 80])
def test_ties_between_lanes_running_pairs_and_the_tail_go_to_the_lowest_index(vocab, compiled):
    """The kernel keeps 16 lanes in two running pairs (even and odd vectors) and a scalar tail:
    a tie between any two of them is the lower index, as in torch."""
    rows = []
    for first in range(vocab):
        for second in {first + 1, first + 16, first + 17, vocab - 1}:
            if first < second < vocab:
                row = torch.zeros(vocab)
                row[[first, second]] = 3.0
                rows.append(row)
    signed_zeros = torch.full((vocab,), -1.0)
    signed_zeros[vocab // 2], signed_zeros[vocab - 1] = -0.0, 0.0  # -0 == +0: the first
    logits = torch.stack([*rows, signed_zeros, torch.full((vocab,), float("-inf"))])
    row_max, index = max_and_argmax_rows(logits, compiled=compiled)
    assert torch.equal(index, logits.argmax(dim=-1))
    assert torch.equal(row_max, logits.amax(dim=-1))


def test_rows_split_over_the_threads_give_the_same_answer(compiled):
    logits = torch.randn(64, 49152, generator=torch.Generator().manual_seed(1))
    logits[5, 40000] = logits[5].max() + 1.0
    logits[6, 123] = float("nan")
    row_max, index = max_and_argmax_rows(logits, compiled=compiled)
    assert torch.equal(index, logits.argmax(dim=-1))
    torch.testing.assert_close(row_max, logits.amax(dim=-1), equal_nan=True)
