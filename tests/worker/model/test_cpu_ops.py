"""The fused CPU norms and activations against the torch ops they replace."""

import shutil

import pytest
import torch
import torch.nn.functional as F
from intentserve.worker.kernels import KernelUnavailable, bf16_gemm_kernel, fused_ops
from intentserve.worker.model import cpu_ops

pytestmark = [
    pytest.mark.skipif(
        not any(shutil.which(n) for n in ("cc", "gcc", "clang")),
        reason="no C compiler (cc, gcc or clang) to build the fused CPU ops",
    ),
    pytest.mark.usefixtures("kernel_variant"),  # each test on every variant this CPU runs
]


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


def _has_avx512_bf16_build() -> bool:
    try:
        bf16_gemm_kernel()
    except KernelUnavailable:
        return False
    return True


def test_bf16_rounding_is_torchs_bit_for_bit_but_denormals_on_avx512_bf16():
    """The kernels' rounding to bfloat16 (here: the residual sum x + r) against torch's, over
    ties to even both ways, overflow to infinity, infinities and denormals. With AVX512-BF16 the
    rounding is one vcvtneps2bf16, which reads a float32 denormal as zero: only those differ,
    and only there; on other builds nothing differs. NaN stays NaN (its payload is not torch's
    canonical one on either path)."""
    one = 1.0
    pairs = [
        (one, 2.0**-8),  # halfway between 1 and its next bf16: to even, down
        (one + 2.0**-7, 2.0**-8),  # halfway, to even, up
        (one, 2.0**-8 + 2.0**-15),  # just past halfway: up
        (-3.0, -(2.0**-7)),  # a tie below zero
        (3.3e38, 3.3e38),  # overflows to inf
        (float("inf"), 1.0),
        (float("-inf"), -1.0),
        (float("nan"), 1.0),
        (2.0**-130, 0.0),  # a denormal sum
        (-(2.0**-131), 0.0),
        (2.0**-126, -(2.0**-127)),  # a normal minus a normal: denormal
    ]
    gen = torch.Generator().manual_seed(3)
    width = 976  # a multiple of the kernel's 16 lanes
    num = width - len(pairs)
    scales = 2.0 ** torch.randint(-20, 20, (num,), generator=gen).float()
    pairs += zip(
        (torch.randn(num, generator=gen) * scales).tolist(),
        (torch.randn(num, generator=gen) * scales).tolist(),
        strict=True,
    )
    x = torch.tensor([p[0] for p in pairs]).to(torch.bfloat16).reshape(1, -1)
    residual = torch.tensor([p[1] for p in pairs]).to(torch.bfloat16).reshape(1, -1)
    expected = (x.float() + residual.float()).to(torch.bfloat16)
    stream = residual.clone()
    done = cpu_ops.add_rmsnorm(
        fused_ops(), x, stream, torch.ones(width, dtype=torch.bfloat16), 1e-6
    )
    assert done is not None and done[1] is stream

    ours, theirs = stream.view(torch.int16)[0], expected.view(torch.int16)[0]
    nan = expected[0].isnan()
    assert stream[0][nan].isnan().all()
    denormal = (expected[0] != 0) & (expected[0].float().abs() < torch.finfo(torch.float32).tiny)
    assert denormal.sum() == 3
    if _has_avx512_bf16_build():
        assert (stream[0][denormal] == 0).all()
        assert torch.equal(stream[0][denormal].signbit(), expected[0][denormal].signbit())
        same = ~nan & ~denormal
    else:
        same = ~nan
    assert torch.equal(ours[same], theirs[same])
    assert (expected[0][:3].float() == torch.tensor([1.0, 1.0 + 2.0**-6, 1.0 + 2.0**-7])).all()
