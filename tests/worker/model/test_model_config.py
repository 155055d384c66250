"""ModelConfig, RoPE scaling parsing, RoPE frequencies against transformers."""

from __future__ import annotations

import pytest
import torch
from intentserve.worker.model.config import RopeScaling, RopeScalingType
from intentserve.worker.model.hf_reference import hf_rope_parameters
from intentserve.worker.model.rope import inverse_frequencies
from tiny_checkpoints import tiny_config
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding


def test_kv_bytes_per_token_smollm2_shape():
    config = tiny_config(num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, hidden_size=576)
    assert config.kv_bytes_per_token(2) == 2 * 30 * 3 * 64 * 2 == 23_040
    assert config.kv_bytes_per_token(4) == 46_080


def test_heads_must_group_evenly():
    with pytest.raises(ValueError, match="num_kv_heads"):
        tiny_config(num_heads=4, num_kv_heads=3)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ({"rope_type": "default", "rope_theta": 1e4}, None),
        ({"type": "linear", "factor": 2.0}, RopeScaling(RopeScalingType.LINEAR, 2.0)),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            RopeScaling(RopeScalingType.LLAMA3, 8.0, 1.0, 4.0, 8192),
        ),
    ],
)
def test_rope_scaling_from_hf(raw, expected):
    assert RopeScaling.from_hf(raw) == expected


def test_unsupported_rope_scaling_names_allowed_values():
    with pytest.raises(ValueError, match=r"'yarn'.*linear.*llama3"):
        RopeScaling.from_hf({"rope_type": "yarn", "factor": 4.0})


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        RopeScaling(RopeScalingType.LINEAR, 4.0),
        RopeScaling(RopeScalingType.LLAMA3, 8.0, 1.0, 4.0, 8192),
    ],
    ids=["default", "linear", "llama3"],
)
def test_inverse_frequencies_equal_transformers(scaling):
    config = tiny_config(
        head_dim=128,
        num_heads=4,
        hidden_size=512,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        rope_scaling=scaling,
    )
    hf_config = LlamaConfig(
        hidden_size=512,
        num_attention_heads=4,
        head_dim=128,
        max_position_embeddings=131072,
        rope_parameters=hf_rope_parameters(config),
    )
    theirs = LlamaRotaryEmbedding(hf_config).inv_freq
    assert torch.equal(inverse_frequencies(128, 500000.0, scaling), theirs)


def test_llama_cpp_freq_factors_equal_transformers_llama3():
    """llama.cpp stores Llama 3.1's recipe as divisors of the default frequencies
    (`rope_freqs.weight`); divided out, they give transformers' `llama3` frequencies."""
    from tiny_checkpoints import llama_cpp_rope_freqs

    llama3 = RopeScaling(RopeScalingType.LLAMA3, 32.0, 1.0, 4.0, 8192)  # Llama 3.2's values
    factors = llama_cpp_rope_freqs(128, 500000.0, llama3)
    assert len(set(factors.tolist())) > 3  # kept, scaled by 32, and blended pairs all occur
    as_factors = RopeScaling(
        RopeScalingType.FREQ_FACTORS, 1.0, freq_factors=tuple(factors.tolist())
    )
    ours = inverse_frequencies(128, 500000.0, as_factors)
    expected = inverse_frequencies(128, 500000.0, llama3)
    assert torch.allclose(ours, expected, rtol=1e-6, atol=0)


def test_freq_factors_cannot_come_from_config_json():
    with pytest.raises(ValueError, match="'freq_factors' is not supported"):
        RopeScaling.from_hf({"rope_type": "freq_factors", "factor": 1.0})
