"""The SmolLM2 GGUF tokenizer, streaming detokenization and chat templates."""

from __future__ import annotations

import pytest
from intentserve.worker.model.gguf_tokenizer import build_gguf_tokenizer
from intentserve.worker.model.tokenizer import IncrementalDecoder, Tokenizer

pytestmark = pytest.mark.model

TEXTS = [
    "Hello world",
    "loved 42 kinds of cheese in 2024, for $3.50",
    "  leading spaces\n\n\ttabs and trailing  ",
    "naïve café — 東京 🤖 ünïcödé",
    "def f(x):\n    return x**2  # comment",
    "I'm sure you're fine; they'll see.",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2) -> Tokenizer:
    return smollm2.tokenizer


@pytest.fixture(scope="module")
def transformers_gguf_tokenizer(smollm2_path):
    # An independent reading of the same GGUF metadata: transformers' own GGUF -> tokenizer path.
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name)


@pytest.mark.parametrize("text", TEXTS)
def test_encoding_matches_transformers_reading_of_the_gguf(
    tokenizer, transformers_gguf_tokenizer, text
):
    assert tokenizer.encode(text) == transformers_gguf_tokenizer.encode(
        text, add_special_tokens=False
    )


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_are_single_ids_and_skipped_on_decode(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tokenizer.decode(ids) == "user\nhi"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert tokenizer.eos_token_ids == (2,) and tokenizer.bos_token_id == 1


def test_add_bos(tokenizer):
    assert tokenizer.encode("hi")[0] != 1  # SmolLM2's GGUF says add_bos_token = false
    assert tokenizer.encode("hi", add_bos=True)[0] == 1


def test_smollm2_chat_template(tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=False,
    )
    assert (
        with_system == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_template_helpers_and_errors(smollm2):
    metadata = dict(smollm2.metadata)
    metadata["tokenizer.chat_template"] = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}"
        "{% endif %}{{ messages | tojson }}"
    )
    tok = build_gguf_tokenizer(metadata)
    assert tok.apply_chat_template([{"role": "user", "content": "<b>"}]) == (
        '[{"role": "user", "content": "<b>"}]'
    )
    with pytest.raises(ValueError, match="first message must be user"):
        tok.apply_chat_template([{"role": "assistant", "content": "x"}])
    metadata["tokenizer.chat_template"] = "{% for %}"
    with pytest.raises(ValueError, match="does not compile"):
        build_gguf_tokenizer(metadata)
    del metadata["tokenizer.chat_template"]
    with pytest.raises(ValueError, match="no chat template"):
        build_gguf_tokenizer(metadata).apply_chat_template([{"role": "user", "content": "x"}])


def test_unsupported_tokenizer_metadata_is_named(smollm2):
    metadata = smollm2.metadata
    with pytest.raises(ValueError, match="tokenizer.ggml.pre 'mystery'"):
        build_gguf_tokenizer(metadata | {"tokenizer.ggml.pre": "mystery"})
    with pytest.raises(ValueError, match="tokenizer.ggml.model 'mystery'"):
        build_gguf_tokenizer(metadata | {"tokenizer.ggml.model": "mystery"})


def test_incremental_decoding_never_splits_characters(tokenizer):
    text = "naïve café — 東京 🤖🎉 done"
    prompt_ids = tokenizer.encode("Say:")
    ids = tokenizer.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens here
    decoder = IncrementalDecoder(tokenizer, prompt_ids)
    deltas = [decoder.append([token_id]) for token_id in ids]
    assert "".join(deltas) == text
    assert not any("\ufffd" in delta for delta in deltas)
    assert "" in deltas  # some ids completed no character on their own


def test_incremental_decoding_of_special_tokens(tokenizer):
    decoder = IncrementalDecoder(tokenizer)
    assert decoder.append(tokenizer.encode("Hi")) == "Hi"
    assert decoder.append([2]) == ""  # <|im_end|> is skipped
    shown = IncrementalDecoder(tokenizer, skip_special_tokens=False)
    assert shown.append(tokenizer.encode("Hi") + [2]) == "Hi<|im_end|>"
