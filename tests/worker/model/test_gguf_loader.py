"""GGUF: dequantization per tensor type, llama.cpp's Q/K layout, metadata, bad files."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from intentserve.worker.model import ModelLoadError, RopeScaling, RopeScalingType, load_model
from intentserve.worker.model.gguf_loader import GGUFFile
from intentserve.worker.model.hf_reference import hf_logits, hf_model
from intentserve.worker.model.reference_attention import reference_logits
from tiny_checkpoints import random_hf_weights, tiny_config, tiny_tokenizer, write_gguf

# Worst-case error of each format on N(0, 1) data, relative to the block's max |value|.
ROUNDTRIP_TOLERANCE = {
    QType.F32: 0.0,
    QType.F16: 1e-3,
    QType.BF16: 1e-2,
    QType.Q8_0: 1e-2,
    QType.Q4_0: 0.15,
    QType.Q4_1: 0.15,
}


def _write_one_tensor(path, name: str, values: np.ndarray, qtype: QType) -> None:
    writer = gguf.GGUFWriter(path, "llama")
    if qtype in (QType.F32, QType.F16):
        writer.add_tensor(name, gguf.quants.quantize(values, qtype))
    else:
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("qtype", list(ROUNDTRIP_TOLERANCE), ids=lambda q: q.name)
def test_dequantize_each_supported_type(tmp_path, qtype):
    values = np.random.default_rng(0).standard_normal((6, 64)).astype(np.float32)  # [rows, cols]
    path = tmp_path / "one.gguf"
    _write_one_tensor(path, "blk.0.ffn_up.weight", values, qtype)

    ours = GGUFFile(path).tensor("blk.0.ffn_up.weight")

    reference = gguf.quants.dequantize(gguf.quants.quantize(values, qtype), qtype)
    assert ours.dtype == torch.float32 and tuple(ours.shape) == values.shape
    assert np.array_equal(ours.numpy(), reference)
    assert np.abs(ours.numpy() - values).max() <= ROUNDTRIP_TOLERANCE[qtype] * np.abs(values).max()


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path):
    path = tmp_path / "x.gguf"
    _write_one_tensor(path, "blk.3.attn_q.weight", np.ones((2, 32), np.float32), QType.Q5_0)
    with pytest.raises(ModelLoadError, match=r"blk\.3\.attn_q\.weight.*Q5_0") as err:
        GGUFFile(path).tensor("blk.3.attn_q.weight")
    assert str(path) in str(err.value)


TINY_CONFIGS = {
    "llama": tiny_config("llama"),
    "qwen2": tiny_config("qwen2", tie_word_embeddings=True),
    "llama-rope-linear": tiny_config(rope_scaling=RopeScaling(RopeScalingType.LINEAR, 4.0)),
    # Llama 3.1/3.2: the file carries `rope_freqs.weight`; the oracle runs transformers' `llama3`.
    "llama-rope-freqs": tiny_config(
        rope_scaling=RopeScaling(
            RopeScalingType.LLAMA3,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=32,
        )
    ),
}


@pytest.mark.parametrize("case", list(TINY_CONFIGS))
def test_tiny_gguf_matches_transformers(tmp_path, case):
    # The llama files carry Q/K in llama.cpp's permuted layout (as its converter writes them),
    # the oracle gets the original weights: equal logits prove the permutation is undone.
    config = TINY_CONFIGS[case]
    weights = random_hf_weights(config)
    loaded = load_model(str(write_gguf(tmp_path / "tiny.gguf", config, weights)), dtype="float32")

    for field in ("num_kv_heads", "qkv_bias", "tie_word_embeddings"):
        assert getattr(loaded.config, field) == getattr(config, field)
    if case == "llama-rope-freqs":
        assert loaded.config.rope_scaling.type is RopeScalingType.FREQ_FACTORS
    else:
        assert loaded.config.rope_scaling == config.rope_scaling
    ids = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6)
    diff = (
        (reference_logits(loaded.model, ids) - hf_logits(hf_model(config, weights), ids))
        .abs()
        .max()
    )
    assert diff < 1e-4


def test_gguf_tokenizer_and_metadata(tmp_path):
    config = tiny_config()
    loaded = load_model(
        str(write_gguf(tmp_path / "tiny.gguf", config, random_hf_weights(config))), "float32"
    )
    reference = tiny_tokenizer()
    for text in [
        "Hello world!",
        "def add(a, b):\n    return a + b",
        "naïve 東京 42",
        "<|im_start|>user",
    ]:
        assert loaded.tokenizer.encode(text, add_bos=False) == reference.encode(text).ids
        assert loaded.tokenizer.decode(loaded.tokenizer.encode(text, add_bos=False), False) == text
    assert loaded.config.bos_token_id == 1 and loaded.config.eos_token_ids == (2,)
    assert loaded.chat_template is not None and "<|im_start|>" in loaded.chat_template
    assert not loaded.config.tie_word_embeddings


# NOTE: file names below avoid the words the messages are matched against.


def test_missing_file_names_path(tmp_path):
    path = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="no such file") as err:
        load_model(str(path))
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    "content", [b"", b"\x00garbage bytes, not a GGUF header" * 10], ids=["empty", "garbage"]
)
def test_corrupt_file_names_path(tmp_path, content):
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match="not a valid GGUF file") as err:
        load_model(str(path))
    assert str(path) in str(err.value)


@pytest.mark.parametrize("num_bytes_cut", [1000, 30_000])
def test_truncated_file_names_path(tmp_path, num_bytes_cut):
    config = tiny_config()
    path = write_gguf(tmp_path / "x.gguf", config, random_hf_weights(config))
    path.write_bytes(path.read_bytes()[:-num_bytes_cut])
    with pytest.raises(ModelLoadError, match="truncated or corrupt") as err:
        load_model(str(path))
    assert str(path) in str(err.value)


@pytest.mark.model
def test_one_parse_serves_the_facts_read_and_the_load(smollm2_path):
    from intentserve.worker.model.gguf_loader import open_gguf

    first = open_gguf(smollm2_path)
    assert open_gguf(str(smollm2_path)) is first  # same file, unchanged: parsed once


def test_unknown_architecture_is_named_with_the_supported_ones(tmp_path):
    config = tiny_config("falcon")
    path = write_gguf(tmp_path / "x.gguf", config, random_hf_weights(config))
    with pytest.raises(
        ModelLoadError, match=r"architecture 'falcon' is not supported.*qwen3"
    ) as err:
        load_model(str(path))
    assert str(path) in str(err.value)


def test_longrope_factor_tensors_are_refused_naming_them(tmp_path):
    # Phi-3 128k files: two factor sets, switched by sequence length; not implemented.
    config = tiny_config("phi3")
    factors = np.ones(config.head_dim // 2, np.float32)
    extra = {"rope_factors_long.weight": factors, "rope_factors_short.weight": factors}
    path = write_gguf(tmp_path / "x.gguf", config, random_hf_weights(config), extra)
    with pytest.raises(ModelLoadError, match="LongRoPE.*rope_factors_long"):
        load_model(str(path))


def test_rope_freqs_of_the_wrong_length_is_refused(tmp_path):
    config = tiny_config()
    extra = {"rope_freqs.weight": np.ones(3, np.float32)}
    path = write_gguf(tmp_path / "x.gguf", config, random_hf_weights(config), extra)
    with pytest.raises(ModelLoadError, match=r"'rope_freqs.weight' has 3 values; expected .* 8"):
        load_model(str(path))
