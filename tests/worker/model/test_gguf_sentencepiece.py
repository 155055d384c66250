"""SentencePiece GGUF tokenizers (`tokenizer.ggml.model = "llama"`) on tiny vocabularies written
here: merges chosen by score, byte fallback, the `▁` space marker, special tokens, and the
metadata flags llama.cpp reads (add_space_prefix, add_bos_token)."""

from __future__ import annotations

import heapq
import random
import re

import pytest
from gguf import TokenType
from hypothesis import given, settings
from hypothesis import strategies as st
from intentserve.worker.model.gguf_tokenizer import build_gguf_tokenizer
from intentserve.worker.model.token_bound import token_bound
from intentserve.worker.model.tokenizer import Tokenizer

SPECIALS = {"<unk>": TokenType.UNKNOWN, "<s>": TokenType.CONTROL, "</s>": TokenType.CONTROL}
BYTES = [f"<0x{b:02X}>" for b in range(256)]
USER_DEFINED = ["<eot>", "  "]  # llama.cpp matches these whole in the raw text
# Normal pieces and scores, as a SentencePiece BPE vocabulary has them: -(merge rank).
PIECES = {
    **{char: -100.0 for char in "▁abchix"},
    "▁h": -1.0,
    "hi": -2.0,
    "▁hi": -3.0,
    "ab": -4.0,
    "bc": -5.0,
    "aa": -6.0,
    "aaa": -7.0,
    "▁a": -8.0,
    "ix": -9.0,
}


def spm_metadata(pieces: dict[str, float] = PIECES, **flags) -> dict:
    tokens = [*SPECIALS, *BYTES, *USER_DEFINED, *pieces]
    types = [
        *SPECIALS.values(),
        *[TokenType.BYTE] * len(BYTES),
        *[TokenType.USER_DEFINED] * len(USER_DEFINED),
        *[TokenType.NORMAL] * len(pieces),
    ]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [pieces.get(t, 0.0) for t in tokens],
        "tokenizer.ggml.token_type": [int(t) for t in types],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": False,
    } | {f"tokenizer.ggml.{key}": value for key, value in flags.items()}


def pieces_of(tokenizer: Tokenizer, text: str) -> list[str]:
    return [tokenizer.token_text(i) for i in tokenizer.encode(text, add_bos=False)]


def spm_reference(pieces: dict[str, float], text: str) -> list[str]:
    """What a SentencePiece BPE encoder does with `text` (no special tokens in it): start from
    characters, repeatedly join the adjacent pair whose join is the best-scored piece (leftmost
    on ties), then spell what is not a piece as its UTF-8 byte tokens."""
    symbols = list(text.replace(" ", "▁"))
    while True:
        candidates = [
            (-pieces[symbols[i] + symbols[i + 1]], i)
            for i in range(len(symbols) - 1)
            if symbols[i] + symbols[i + 1] in pieces
        ]
        if not candidates:
            break
        _, i = heapq.nsmallest(1, candidates)[0]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    return [
        piece
        for symbol in symbols
        for piece in ([symbol] if symbol in pieces else [f"<0x{b:02X}>" for b in symbol.encode()])
    ]


@pytest.mark.parametrize(
    ("scores", "expected"),
    [({"ab": -4.0, "bc": -5.0}, ["ab", "c"]), ({"ab": -5.0, "bc": -4.0}, ["a", "bc"])],
    ids=["ab-first", "bc-first"],
)
def test_the_best_scored_join_is_made_first(scores, expected):
    tokenizer = build_gguf_tokenizer(spm_metadata(PIECES | scores))
    assert pieces_of(tokenizer, "abc") == expected


def test_a_piece_forms_from_any_of_its_splits():
    # "abc" (scored worse than both halves) forms from ab + c as well as from a + bc.
    for scores in ({"ab": -4.0, "bc": -5.0}, {"ab": -5.0, "bc": -4.0}):
        tokenizer = build_gguf_tokenizer(spm_metadata(PIECES | scores | {"abc": -50.0}))
        assert pieces_of(tokenizer, "abc") == ["abc"]


def test_random_texts_match_the_sentencepiece_algorithm():
    tokenizer = build_gguf_tokenizer(spm_metadata())
    rng = random.Random(0)
    alphabet = ["a", "b", "c", "h", "i", "x", " ", "é", "z"]
    for _ in range(500):
        # No two spaces in a row: "  " is a user-defined token, outside the reference's scope.
        text = re.sub(" +", " ", "".join(rng.choices(alphabet, k=rng.randint(1, 12))))
        assert pieces_of(tokenizer, text) == spm_reference(PIECES, text), text


def test_spaces_become_the_space_marker():
    tokenizer = build_gguf_tokenizer(spm_metadata())
    assert pieces_of(tokenizer, "hi hi") == ["hi", "▁hi"]
    assert tokenizer.decode(tokenizer.encode("hi hi")) == "hi hi"


def test_add_space_prefix_marks_the_start_of_every_text_run():
    # As llama.cpp does: a space goes before the text at the start and after each special token.
    tokenizer = build_gguf_tokenizer(spm_metadata(add_space_prefix=True))
    assert pieces_of(tokenizer, "hi hi") == ["▁hi", "▁hi"]
    assert pieces_of(tokenizer, " hi") == ["▁", "▁hi"]
    assert pieces_of(tokenizer, "<s>hi<eot>hi") == ["<s>", "▁hi", "<eot>", "▁hi"]
    assert tokenizer.decode(tokenizer.encode("hi hi")) == "hi hi"


def test_add_space_prefix_defaults_to_llama_cpp_default():
    metadata = spm_metadata()
    del metadata["tokenizer.ggml.add_space_prefix"]
    assert pieces_of(build_gguf_tokenizer(metadata), "hi") == ["▁hi"]


def test_characters_outside_the_vocabulary_fall_back_to_bytes():
    tokenizer = build_gguf_tokenizer(spm_metadata())
    assert pieces_of(tokenizer, "aé") == ["a", "<0xC3>", "<0xA9>"]
    assert pieces_of(tokenizer, "🤖") == ["<0xF0>", "<0x9F>", "<0xA4>", "<0x96>"]
    for text in ["aé", "hi 🤖 東京", "z\tz\n"]:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_and_user_defined_tokens_are_matched_whole():
    tokenizer = build_gguf_tokenizer(spm_metadata())
    ids = tokenizer.encode("<s>hi<eot>a  b</s>", add_bos=False)
    assert [tokenizer.token_text(i) for i in ids] == ["<s>", "hi", "<eot>", "a", "  ", "b", "</s>"]
    # Control tokens are dropped on decode; user-defined ones are text.
    assert tokenizer.decode(ids) == "hi<eot>a  b"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<s>hi<eot>a  b</s>"


def test_bos_eos_and_their_defaults():
    tokenizer = build_gguf_tokenizer(spm_metadata())
    assert tokenizer.bos_token_id == 1 and tokenizer.eos_token_ids == (2,)
    # llama.cpp adds BOS to a SentencePiece vocabulary whose metadata does not say otherwise.
    assert tokenizer.encode("hi")[0] == 1
    assert build_gguf_tokenizer(spm_metadata(add_bos_token=False)).encode("hi")[0] != 1
    with_eot = build_gguf_tokenizer(spm_metadata(eot_token_id=len(SPECIALS) + len(BYTES)))
    assert with_eot.eos_token_ids == (2, len(SPECIALS) + len(BYTES))


def test_unsupported_metadata_is_refused_by_name():
    with pytest.raises(ValueError, match=r"tokenizer.ggml.model 'mystery'.*'gpt2'.*'llama'"):
        build_gguf_tokenizer(spm_metadata(model="mystery"))
    with pytest.raises(ValueError, match="tokenizer.ggml.add_eos_token"):
        build_gguf_tokenizer(spm_metadata(add_eos_token=True))


def test_an_end_of_turn_control_token_ends_generation_when_no_eot_id_is_named():
    # Gemma's GGUF names only <eos> as an end token, yet its chat turns end with <end_of_turn>.
    metadata = spm_metadata()
    metadata["tokenizer.ggml.tokens"] = [*metadata["tokenizer.ggml.tokens"], "<end_of_turn>"]
    metadata["tokenizer.ggml.scores"] = [*metadata["tokenizer.ggml.scores"], 0.0]
    metadata["tokenizer.ggml.token_type"] = [
        *metadata["tokenizer.ggml.token_type"],
        int(TokenType.CONTROL),
    ]
    end_of_turn = len(metadata["tokenizer.ggml.tokens"]) - 1
    assert build_gguf_tokenizer(metadata).eos_token_ids == (2, end_of_turn)
    named = build_gguf_tokenizer(metadata | {"tokenizer.ggml.eot_token_id": 1})
    assert named.eos_token_ids == (2, 1)  # the file's own choice stands


def test_per_token_arrays_must_match_the_vocabulary():
    for key in ("scores", "token_type"):
        metadata = spm_metadata()
        metadata[f"tokenizer.ggml.{key}"] = metadata[f"tokenizer.ggml.{key}"][:-1]
        with pytest.raises(ValueError, match=f"tokenizer.ggml.{key} has"):
            build_gguf_tokenizer(metadata)


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(
        st.one_of(st.text(max_size=8), st.sampled_from([" ", "  ", "▁", "hi", "<s>", "<eot>"])),
        max_size=12,
    ).map("".join),
    add_space_prefix=st.booleans(),
)
def test_no_text_makes_fewer_tokens_than_the_bound(text, add_space_prefix):
    # Spaces grow into 3-byte `▁`s and unknown characters into byte tokens: nothing is dropped,
    # so a cheap bound on the number of tokens exists, as for byte-level BPE.
    tokenizer = build_gguf_tokenizer(spm_metadata(add_space_prefix=add_space_prefix))
    assert tokenizer.min_num_tokens(text.encode()) <= len(tokenizer.encode(text, add_bos=False))


def test_the_bound_is_the_longest_token_in_utf8():
    bound = token_bound(build_gguf_tokenizer(spm_metadata()).backend)
    assert bound is not None and bound.dropped_bytes == b""
    assert bound.max_bytes_per_token == len("<0x00>")  # longer than any piece here


def test_a_vocabulary_that_can_drop_characters_has_no_bound():
    metadata = spm_metadata()
    del metadata["tokenizer.ggml.unknown_token_id"]
    metadata["tokenizer.ggml.tokens"] = [
        "<0xC3>-missing" if t == "<0xC3>" else t for t in metadata["tokenizer.ggml.tokens"]
    ]
    tokenizer = build_gguf_tokenizer(metadata)
    assert tokenizer.encode("é", add_bos=False) == []  # no <0xC3> and no unknown token
    assert token_bound(tokenizer.backend) is None
