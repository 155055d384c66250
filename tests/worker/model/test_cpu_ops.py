"""The fused CPU norms and activations against the torch ops they replace."""

import shutil

import pytest
import torch
import torch.nn.functional as F
from intentserve.worker.attention.cpu_kernels import fused_ops
from intentserve.worker.model import cpu_ops

pytestmark = pytest.mark.skipif(
    not any(shutil.which(n) for n in ("cc", "gcc", "clang")),
    reason="no C compiler (cc, gcc or clang) to build the fused CPU ops",
)


def torch_add_rmsnorm(x, residual, weight, eps):
    total = x + residual
    x32 = total.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype), total


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_add_rmsnorm_matches_the_torch_ops_and_updates_the_residual(dtype):
    gen = torch.Generator().manual_seed(0)
    x, residual = (
        (3 * torch.randn(37, 576, generator=gen)).to(dtype),
        torch.randn(37, 576).to(dtype),
    )
    weight = (1 + torch.randn(576, generator=gen)).to(dtype)
    expected, expected_sum = torch_add_rmsnorm(x, residual, weight, 1e-5)
    stream = residual.clone()
    out, total = cpu_ops.add_rmsnorm(fused_ops(), x, stream, weight, 1e-5)
    assert total is stream and torch.equal(stream, expected_sum)  # the sum, in place
    if dtype == torch.bfloat16:
        # Rounded where torch rounds: at most a last-place difference from summation order.
        assert (out != expected).float().mean().item() < 1e-3
        torch.testing.assert_close(out, expected, rtol=1e-2, atol=0)
    else:
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    # 37 rows are split over the threads: a row alone (serial) comes out the same, bit for bit
    alone, _ = cpu_ops.add_rmsnorm(fused_ops(), x[30:31], residual[30:31].clone(), weight, 1e-5)
    assert torch.equal(alone, out[30:31])


def test_add_rmsnorm_without_a_residual_normalizes_x():
    x = torch.randn(5, 64)
    weight = torch.rand(64)
    out, total = cpu_ops.add_rmsnorm(fused_ops(), x, None, weight, 1e-6)
    assert total is x
    torch.testing.assert_close(out, torch_add_rmsnorm(x, torch.zeros_like(x), weight, 1e-6)[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_and_mul_matches_the_torch_ops(dtype):
    gate_up = (4 * torch.randn(33, 2 * 1536, generator=torch.Generator().manual_seed(1))).to(dtype)
    gate, up = gate_up.split(1536, dim=-1)
    expected = F.silu(gate) * up
    out = cpu_ops.silu_and_mul(fused_ops(), gate_up)
    if dtype == torch.bfloat16:
        assert (out != expected).float().mean().item() < 1e-3  # exp differs in the last bits
        torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)
    else:
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_shapes_the_kernels_do_not_take_fall_back():
    ops = fused_ops()
    assert cpu_ops.add_rmsnorm(ops, torch.randn(3, 20), None, torch.ones(20), 1e-6) is None
    assert cpu_ops.silu_and_mul(ops, torch.randn(3, 40)) is None  # 20 per half
    assert cpu_ops.silu_and_mul(ops, torch.randn(3, 64, dtype=torch.float16)) is None
    strided = torch.randn(64, 3).t()
    assert cpu_ops.add_rmsnorm(ops, strided, None, torch.ones(64), 1e-6) is None


@pytest.mark.parametrize("rows", [7, 40])  # serial; split over the threads
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rotary_in_place_matches_apply_rotary_bit_for_bit(dtype, rows):
    from intentserve.worker.model.rope import apply_rotary

    gen = torch.Generator().manual_seed(2)
    num_heads, num_kv_heads, head_dim = 9, 3, 64
    width = (num_heads + 2 * num_kv_heads) * head_dim  # a fused q|k|v row
    qkv = (3 * torch.randn(rows, width, generator=gen)).to(dtype)
    angles = 100 * torch.rand(rows, 1, head_dim // 2, generator=gen)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    rotated = num_heads + num_kv_heads
    qk = qkv[:, : rotated * head_dim].view(rows, rotated, head_dim)
    expected = apply_rotary(qk, cos, sin)
    v_before = qkv[:, rotated * head_dim :].clone()
    assert cpu_ops.rotary_(fused_ops(), qkv, cos, sin, rotated, head_dim)
    assert torch.equal(qkv[:, : rotated * head_dim].view(rows, rotated, head_dim), expected)
    assert torch.equal(qkv[:, rotated * head_dim :], v_before)  # v is not rotated


def test_rotary_leaves_shapes_it_does_not_take_to_torch():
    qkv = torch.randn(2, 3 * 48)  # head_dim 48: half of it is not whole 16-lane vectors
    cos = sin = torch.ones(2, 1, 24)
    assert not cpu_ops.rotary_(fused_ops(), qkv, cos, sin, 2, 48)
