"""Gemma 3's compiled CPU ops (gemma_ops.c) against the torch ops of the Python layers they
replace (worker/model/gemma.py)."""

import shutil
from dataclasses import replace

import pytest
import torch
from intentserve.worker.kernels import gemma_ops
from intentserve.worker.model import cpu_ops
from intentserve.worker.model.gemma import GemmaAttention, GemmaRMSNorm, gelu_tanh
from intentserve.worker.model.rope import RotaryEmbedding

from tests.worker.model.tiny_checkpoints import tiny_config

pytestmark = [
    pytest.mark.skipif(
        not any(shutil.which(n) for n in ("cc", "gcc", "clang")),
        reason="no C compiler (cc, gcc or clang) to build the Gemma CPU ops",
    ),
    pytest.mark.usefixtures("kernel_variant"),  # each test on every variant this CPU runs
]


def _close(ours: torch.Tensor, torchs: torch.Tensor, mismatches: float = 2e-3) -> None:
    """bfloat16: rounded where torch rounds, so a last place apart only where float32
    summation order (the norms' mean) or GELU's tanh (through exp, against torch's) lands on
    the other side of a rounding boundary: at most `mismatches` of the values; float32: within
    a few ulps."""
    if ours.dtype == torch.bfloat16:
        assert (ours != torchs).float().mean().item() < mismatches
        torch.testing.assert_close(ours, torchs, rtol=1e-2, atol=1e-2)
    else:
        torch.testing.assert_close(ours, torchs, rtol=1e-5, atol=4e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("residual", [False, True], ids=["norm", "residual-add"])
def test_gemma_norm_matches_the_torch_ops(dtype, residual):
    gen = torch.Generator().manual_seed(0)
    norm = GemmaRMSNorm(640, 1e-6)
    norm.scale.data = 1 + 0.3 * torch.randn(640, generator=gen)
    h = (3 * torch.randn(37, 640, generator=gen)).to(dtype)
    x = torch.randn(37, 640, generator=gen).to(dtype)
    expected = x + norm.forward(h) if residual else norm.forward(h)
    norm.gemma_ops = gemma_ops()
    stream = x.clone()
    got = norm.add_to(h, stream) if residual else norm.forward(h)
    if residual:
        assert got is stream  # the sum in place
    _close(got, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("q_multiplier", [1.0, 1.3])
def test_qk_norm_rotary_matches_the_torch_ops(dtype, q_multiplier):
    gen = torch.Generator().manual_seed(1)
    config = replace(tiny_config("gemma3"), head_dim=256, num_heads=4, num_kv_heads=1)
    attn = GemmaAttention(config, 0)
    attn.q_norm.scale.data = 1 + 0.3 * torch.randn(256, generator=gen)
    attn.k_norm.scale.data = 1 + 0.3 * torch.randn(256, generator=gen)
    attn.q_multiplier = q_multiplier
    qkv = (2 * torch.randn(9, 6 * 256, generator=gen)).to(dtype)
    cos_sin = RotaryEmbedding(config)(torch.arange(9) * 7, dtype)
    q, k = attn._norm_rotate(qkv, cos_sin)
    attn.gemma_ops = gemma_ops()
    rotated = qkv.clone()
    assert attn._norm_rotate_in_place(rotated, cos_sin)
    _close(rotated[:, : 4 * 256].view(9, 4, 256), q)
    _close(rotated[:, 4 * 256 : 5 * 256].view(9, 1, 256), k)
    assert torch.equal(rotated[:, 5 * 256 :], qkv[:, 5 * 256 :])  # v untouched


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gelu_and_mul_matches_the_torch_ops(dtype):
    gate_up = (4 * torch.randn(33, 2 * 2048, generator=torch.Generator().manual_seed(2))).to(dtype)
    gate, up = gate_up.split(2048, dim=-1)
    # NOTE: where torch's tanh saturates to -1 (u below ~-8.7) ours may still be 1 - 2^-24
    # above it: a GELU of ~1e-7 g where torch's is -0 (0.5% of these bf16 values).
    _close(cpu_ops.gelu_and_mul(gemma_ops(), gate_up), gelu_tanh(gate) * up, mismatches=1e-2)


def test_shapes_the_gemma_kernels_do_not_take_stay_in_torch():
    ops = gemma_ops()
    scale = torch.ones(40)
    assert cpu_ops.gemma_norm(ops, torch.randn(3, 40), scale, 1e-6) is None  # not 16-wide
    assert cpu_ops.gemma_norm(ops, torch.randn(3, 64), torch.ones(64).bfloat16(), 1e-6) is None
    assert cpu_ops.gelu_and_mul(ops, torch.randn(3, 40)) is None
