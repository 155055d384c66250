"""bench/hf_tokenizer.py: the folder it writes, read by transformers as vLLM's benchmark client
reads it, encodes every text to the ids the worker's own tokenizer gives (BOS included where the
checkpoint adds it) and carries the checkpoint's chat template."""

from __future__ import annotations

import json

import pytest
from intentserve.worker.model.gguf_loader import open_gguf
from intentserve.worker.model.gguf_tokenizer import build_gguf_tokenizer
from intentserve.worker.model.registry import resolve_model_path

from bench.hf_tokenizer import main

pytestmark = pytest.mark.model

TEXTS = [
    "Hello world 123",
    " a leading space",
    "naïve café — 東京 🤖",
    "<|im_start|>user\nhi<|im_end|>",
    "<start_of_turn>user\nHi<end_of_turn>",
    "def f(x):\n    return x**2",
]


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_transformers_reads_the_folder_and_counts_the_workers_tokens(model, tmp_path, capsys):
    from transformers import AutoTokenizer

    assert main([model, str(tmp_path / "tok")]) == 0
    assert "tokenizer.json" in capsys.readouterr().out
    ours = build_gguf_tokenizer(open_gguf(resolve_model_path(model)).metadata)
    theirs = AutoTokenizer.from_pretrained(tmp_path / "tok")
    for text in TEXTS:
        assert theirs(text).input_ids == ours.encode(text), text
    assert theirs.chat_template == ours.chat_template
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] == ours.add_bos_token
    assert theirs.convert_tokens_to_ids(config["eos_token"]) in ours.eos_token_ids


def test_a_model_that_is_not_a_gguf_file_is_refused_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["minilm-l6", str(tmp_path / "tok")])
    assert "model: 'minilm-l6'" in capsys.readouterr().err
    assert not (tmp_path / "tok").exists()
