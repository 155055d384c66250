"""The test-only Q6_K encoder (q6k_encoder.py) read back by gguf's own dequantizer."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType
from q6k_encoder import BLOCK_BYTES, quantize_q6_k


def test_q6_k_round_trip_is_within_one_step_of_each_sub_block():
    values = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32) * 3
    values[0, :16] = 0.0  # an all-zero sub-block
    values[1, :256] = 0.0  # an all-zero block
    encoded = quantize_q6_k(values)
    assert encoded.shape == (8, 2 * BLOCK_BYTES) and encoded.dtype == np.uint8

    decoded = gguf.quants.dequantize(encoded, QType.Q6_K).reshape(values.shape)

    sub_blocks = np.abs(values.reshape(-1, 16))
    error = np.abs(decoded - values).reshape(-1, 16)
    # 6 bits: one step is the sub-block's largest magnitude / 32; the int8 sub-scale adds <1%.
    assert np.all(error <= sub_blocks.max(-1, keepdims=True) / 32 * 1.01 + 1e-7)
    assert np.all(decoded[0, :16] == 0) and np.all(decoded[1, :256] == 0)
    relative_rms = np.sqrt(((decoded - values) ** 2).mean() / (values**2).mean())
    assert relative_rms < 0.025  # between Q8_0 (~0.005) and Q4_0 (~0.09) on normal data


def test_q6_k_needs_whole_blocks():
    with pytest.raises(ValueError, match="256"):
        quantize_q6_k(np.zeros((2, 576), np.float32))
