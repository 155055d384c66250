"""GGUF: dequantization per tensor type, llama.cpp's Q/K layout, metadata, bad files."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from intentserve.worker.model import (
    ModelLoadError,
    RopeScaling,
    RopeScalingType,
    gguf_loader,
    load_model,
)
from intentserve.worker.model.gguf_loader import (
    SUPPORTED_TENSOR_TYPES,
    GGUFFile,
    gguf_model_config,
)
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


def _write_raw_blocks(path, name: str, qtype: QType, num_rows: int, num_blocks: int) -> np.ndarray:
    """A tensor of random bytes in `qtype`'s block layout (any type, even those gguf cannot
    quantize); returns the bytes, [num_rows, num_blocks * type_size] uint8."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(1).integers(0, 256, (num_rows, num_blocks * type_size), np.uint8)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor(name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return raw


def test_supported_types_are_what_gguf_can_dequantize():
    # K-quants, IQ, TQ and MXFP4 are in; the types gguf has no dequantizer for are not.
    for qtype in (QType.Q2_K, QType.Q4_K, QType.Q6_K, QType.Q5_0, QType.IQ4_XS, QType.TQ2_0):
        assert qtype in SUPPORTED_TENSOR_TYPES
    for qtype in (QType.Q8_1, QType.Q8_K, QType.I32, QType.F64):
        assert qtype not in SUPPORTED_TENSOR_TYPES


@pytest.mark.parametrize(
    "qtype",
    [q for q in SUPPORTED_TENSOR_TYPES if q not in (QType.F32, QType.F16)],
    ids=lambda q: q.name,
)
# Random bytes make some block scales inf or NaN; gguf warns, and both sides agree on them.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_every_supported_type_dequantizes_as_gguf_does(tmp_path, qtype):
    path = tmp_path / "one.gguf"
    block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = _write_raw_blocks(path, "blk.0.ffn_up.weight", qtype, num_rows=3, num_blocks=2)

    ours = GGUFFile(path).tensor("blk.0.ffn_up.weight")

    assert ours.dtype == torch.float32 and tuple(ours.shape) == (3, 2 * block_size)
    np.testing.assert_array_equal(ours.numpy(), gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", [QType.Q8_1, QType.Q8_K], ids=lambda q: q.name)
def test_unsupported_tensor_type_names_tensor_and_type(tmp_path, qtype):
    path = tmp_path / "x.gguf"
    _write_raw_blocks(path, "blk.3.attn_q.weight", qtype, num_rows=2, num_blocks=1)
    with pytest.raises(ModelLoadError, match=rf"blk\.3\.attn_q\.weight.*{qtype.name}") as err:
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
    # Banded layers (5 tokens) around one global layer, prompts longer than the band; the file
    # stores norms as 1 + w, as llama.cpp's converter writes them.
    "gemma3": tiny_config("gemma3"),
}


@pytest.mark.parametrize("case", list(TINY_CONFIGS))
def test_tiny_gguf_matches_transformers(tmp_path, case):
    # The llama files carry Q/K in llama.cpp's permuted layout (as its converter writes them),
    # the oracle gets the original weights: equal logits prove the permutation is undone.
    config = TINY_CONFIGS[case]
    weights = random_hf_weights(config)
    loaded = load_model(str(write_gguf(tmp_path / "tiny.gguf", config, weights)), dtype="float32")

    for field in (
        "num_kv_heads",
        "qkv_bias",
        "tie_word_embeddings",
        "layer_windows",
        "rope_local_theta",
    ):
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


def _gemma3_header(path, num_layers: int = 6, **extra) -> GGUFFile:
    """A gemma3 file with metadata only (the config needs no tensors)."""
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(num_layers)
    writer.add_feed_forward_length(96)
    writer.add_head_count(4)
    writer.add_head_count_kv(1)
    writer.add_key_length(32)
    writer.add_value_length(32)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(300)
    for key, value in extra.items():  # ints as llama.cpp writes them (uint32), floats float32
        add = writer.add_uint32 if isinstance(value, int) else writer.add_float32
        add(f"gemma3.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFFile(path)


def test_gemma3_layout_comes_from_the_window_and_llama_cpps_fixed_pattern(tmp_path):
    f = _gemma3_header(tmp_path / "g.gguf", num_layers=12, **{"attention.sliding_window": 8})
    config = gguf_model_config(f)
    # Every 6th layer global; local layers on RoPE base 10000, global on the file's (default).
    assert config.layer_windows == (8, 8, 8, 8, 8, None) * 2
    assert (config.rope_local_theta, config.rope_theta) == (10000.0, 10000.0)
    assert config.query_pre_attn_scalar == 32  # head_dim


def test_gemma3_27b_scales_queries_by_hidden_over_heads(tmp_path):
    f = _gemma3_header(tmp_path / "g.gguf", num_layers=62, **{"attention.sliding_window": 8})
    assert gguf_model_config(f).query_pre_attn_scalar == 64 // 4


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({}, "gemma3.attention.sliding_window is missing"),
        (
            {"attention.sliding_window": 8, "final_logit_softcapping": 30.0},
            "gemma3.final_logit_softcapping: logit soft-capping is not supported",
        ),
    ],
    ids=["no-window", "softcap"],
)
def test_gemma3_metadata_it_cannot_honour_is_refused_naming_the_key(tmp_path, extra, says):
    f = _gemma3_header(tmp_path / "g.gguf", **extra)
    with pytest.raises(ValueError, match=says):
        gguf_model_config(f)


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


@pytest.mark.parametrize("qtype", [QType.Q4_1, QType.Q4_K, QType.Q6_K], ids=lambda q: q.name)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_file_types_the_kernel_holds_are_dequantized_by_it(tmp_path, monkeypatch, qtype):
    """Loading SmolLM2 spent 3.7 s of its 5.3 in gguf's numpy dequantizer; the compiled one
    (bit for bit the same) takes the types it can hold. Where no kernel builds, gguf reads them."""
    if gguf_loader._compiled_dequantizer() is None:
        pytest.skip(
            "this host cannot build or run gguf_gemm.c (needs AVX2, F16C, FMA and a C compiler)"
        )
    path = tmp_path / "one.gguf"
    raw = _write_raw_blocks(path, "blk.0.ffn_up.weight", qtype, num_rows=4, num_blocks=2)
    expected = gguf.quants.dequantize(raw, qtype)

    def numpy_dequantizer_not_called(*_):
        raise AssertionError("gguf's numpy dequantizer was used")

    monkeypatch.setattr(gguf.quants, "dequantize", numpy_dequantizer_not_called)
    f = GGUFFile(path)
    np.testing.assert_array_equal(f.tensor("blk.0.ffn_up.weight").numpy(), expected)
    # Written in bfloat16 by the kernel: the float32 values, rounded once as torch rounds them.
    as_bf16 = f.tensor("blk.0.ffn_up.weight", torch.bfloat16)
    assert as_bf16.dtype == torch.bfloat16
    assert torch.equal(as_bf16, torch.from_numpy(expected).to(torch.bfloat16))

    monkeypatch.setattr(gguf_loader, "_compiled_dequantizer", lambda: None)
    with pytest.raises(AssertionError, match="numpy dequantizer was used"):
        GGUFFile(path).tensor("blk.0.ffn_up.weight")
