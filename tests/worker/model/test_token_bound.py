"""The fewest tokens a text can make, known without tokenizing: never more than the tokenizer
really makes (so no prompt that fits is refused), for byte-level BPE; no bound for tokenizers
that may drop or shrink their input."""

from __future__ import annotations

import operator

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from intentserve.worker.model.gguf_loader import GGUFFile
from intentserve.worker.model.gguf_tokenizer import build_gguf_tokenizer
from intentserve.worker.model.token_bound import token_bound
from tiny_checkpoints import SPECIAL_TOKENS, tiny_tokenizer
from tokenizers import AddedToken, Regex, normalizers, pre_tokenizers

TINY = tiny_tokenizer()
VOCAB_IDS = range(TINY.get_vocab_size(with_added_tokens=True))
# Text as clients send it and as it is hard on a bound: whitespace runs (the longest tokens),
# control characters, special-token strings, any Unicode.
pieces = st.one_of(
    st.text(max_size=12),
    st.sampled_from([*SPECIAL_TOKENS, "\n", " ", "\t", "\x04", "ĠĠ", "The quick brown fox"]),
    st.builds(operator.mul, st.sampled_from(["\n", " ", "\t", "a", "0"]), st.integers(1, 200)),
)
texts = st.lists(pieces, max_size=12).map("".join)


def assert_bound_holds(backend: tokenizers.Tokenizer, text: str) -> None:
    bound = token_bound(backend)
    assert bound is not None
    assert bound.min_num_tokens(text.encode("utf-8")) <= len(backend.encode(text).ids), text


@settings(max_examples=200, deadline=None)
@given(texts)
def test_no_byte_level_text_makes_fewer_tokens_than_the_bound(text):
    assert_bound_holds(TINY, text)


def test_the_bound_is_the_longest_token():
    bound = token_bound(TINY)
    longest = max(len(TINY.decode([i], skip_special_tokens=False).encode()) for i in VOCAB_IDS)
    assert bound.max_bytes_per_token == longest
    assert bound.dropped_bytes == b""  # the tiny vocabulary has all 256 byte characters


def with_part(change) -> tokenizers.Tokenizer:
    backend = tiny_tokenizer()
    change(backend)
    return backend


@pytest.mark.parametrize(
    "change",
    [
        lambda b: setattr(b, "normalizer", normalizers.NFKC()),
        lambda b: setattr(b, "pre_tokenizer", pre_tokenizers.Whitespace()),
        lambda b: setattr(
            b,
            "pre_tokenizer",
            pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(" +"), "removed"), pre_tokenizers.ByteLevel()]
            ),
        ),
        lambda b: b.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)]),
    ],
    ids=["normalizer", "whitespace_pre_tokenizer", "split_removed", "lstrip_added_token"],
)
def test_tokenizers_that_may_drop_or_shrink_input_have_no_bound(change):
    assert token_bound(with_part(change)) is None


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path) -> tokenizers.Tokenizer:
    return build_gguf_tokenizer(GGUFFile(smollm2_path).metadata).backend


@pytest.mark.model
def test_smollm2s_bound_is_its_longest_token_and_the_bytes_it_drops(smollm2_tokenizer):
    bound = token_bound(smollm2_tokenizer)
    ids = [[i] for i in range(smollm2_tokenizer.get_vocab_size(with_added_tokens=True))]
    decoded = smollm2_tokenizer.decode_batch(ids, skip_special_tokens=False)
    assert bound.max_bytes_per_token == max(len(text.encode()) for text in decoded) == 81
    assert bound.dropped_bytes.startswith(b"\x04\x06\x13\x14\x16\x1d")
    assert smollm2_tokenizer.encode("\x04\x06\x13").ids == []


@pytest.mark.model
@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_no_smollm2_text_makes_fewer_tokens_than_the_bound(smollm2_tokenizer, text):
    assert_bound_holds(smollm2_tokenizer, text)
