"""Quantized projections: close to the floats they came from, the same answer on the kernel path
(few rows) and the dequantize path (many rows), and Q4_1 blocks held exactly."""

import pytest
import torch
import torch.nn.functional as F
from intentserve.policy import WeightFormat
from intentserve.worker.model.quant_linear import (
    GROUP_SIZE,
    KERNEL_MAX_ROWS,
    Int4Linear,
    Int8Linear,
    WeightShapeError,
    quantize_int4,
    unpack_int4,
)
from intentserve.worker.model.weight_format import weight_format_statuses

MODULES = {WeightFormat.INT8: Int8Linear, WeightFormat.INT4: Int4Linear}


def weights(out_features=192, in_features=128, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=generator) * 0.05


def rows(n, in_features=128, dtype=torch.float32):
    return torch.randn(n, in_features, generator=torch.Generator().manual_seed(n)).to(dtype)


def test_the_int4_pack_layout_is_the_one_unpack_reads():
    q = torch.randint(0, 16, (256, 192), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    assert torch.equal(unpack_int4(packed, 256, 192).to(torch.int32), q)


def pack_by_hand(q: torch.Tensor, lanes: int) -> torch.Tensor:
    """torch's CPU int4 pack, written out: per block of 2 * lanes channels, byte [k, n % lanes]
    holds input k of channel n, in the low nibble for the block's first half, else the high."""
    out_features, in_features = q.shape
    n, k = torch.meshgrid(torch.arange(out_features), torch.arange(in_features), indexing="ij")
    at = (n // (2 * lanes)) * in_features * lanes + k * lanes + n % lanes
    shift = torch.where(n % (2 * lanes) < lanes, 0, 4)
    packed = torch.zeros(out_features * in_features // 2, dtype=torch.int64)
    packed.index_add_(0, at.reshape(-1), (q << shift).reshape(-1))
    return packed.to(torch.uint8).reshape(out_features, in_features // 2)


@pytest.mark.parametrize(("capability", "lanes"), [("AVX512", 32), ("AVX2", 16)])
def test_unpack_reads_the_int4_layout_of_each_of_torchs_cpu_kernels(monkeypatch, capability, lanes):
    """AVX-512 hosts pack 64-channel blocks, AVX2-only ones (Zen 3) 32-channel blocks: both are
    read, whichever host runs this."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    q = torch.randint(0, 16, (128, 64), generator=torch.Generator().manual_seed(2))
    assert torch.equal(unpack_int4(pack_by_hand(q, lanes), 128, 64).to(torch.int64), q)


def test_q4_1_blocks_are_held_exactly_as_int4():
    # A Q4_1 block: 32 weights q * d + m with q in 0..15, its min and max reached (as the format's
    # quantizer makes them), so min/max grouping finds the same d, m and q again.
    generator = torch.Generator().manual_seed(1)
    out_features, in_features = 128, 64
    q = torch.randint(0, 16, (out_features, in_features), generator=generator)
    q[:, ::GROUP_SIZE] = 0
    q[:, 1::GROUP_SIZE] = 15
    d = torch.rand(out_features, in_features // GROUP_SIZE, 1, generator=generator) * 0.01 + 1e-3
    m = -torch.rand(out_features, in_features // GROUP_SIZE, 1, generator=generator) * 0.1
    w = (q.reshape(out_features, -1, GROUP_SIZE) * d + m).reshape(out_features, in_features)
    got_q, _, _ = quantize_int4(w)
    assert torch.equal(got_q, q.to(torch.int32))
    held = Int4Linear(w, None, torch.float32).dequantize()
    assert torch.allclose(held, w, atol=1e-6, rtol=0)


@pytest.mark.parametrize("fmt", list(MODULES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_and_dequantize_paths_agree_and_stay_close_to_the_floats(fmt, dtype):
    w = weights()
    module = MODULES[fmt](w, None, dtype)
    few, many = rows(KERNEL_MAX_ROWS[fmt], dtype=dtype), rows(KERNEL_MAX_ROWS[fmt] + 1, dtype=dtype)
    held = module.dequantize()
    tolerance = 2e-2 if dtype is torch.bfloat16 else 1e-4
    for x in (few, many):
        assert torch.allclose(module(x).float(), F.linear(x, held).float(), atol=tolerance)
    # The quantization error itself: int8 keeps ~1/254 of each row's range, int4 ~1/30 of a group's.
    error = (held.float() - w).abs().max().item()
    step = w.abs().max().item() / (127 if fmt is WeightFormat.INT8 else 7.5)
    assert 0 < error <= step


@pytest.mark.parametrize("fmt", list(MODULES))
def test_a_bias_is_added_on_both_paths(fmt):
    w, bias = weights(), torch.arange(192, dtype=torch.float32)
    module = MODULES[fmt](w, bias, torch.float32)
    for n in (1, KERNEL_MAX_ROWS[fmt] + 1):
        x = rows(n)
        assert torch.allclose(module(x), F.linear(x, module.dequantize(), bias), atol=1e-4)


def test_int4_refuses_a_shape_its_layout_cannot_hold():
    with pytest.raises(WeightShapeError, match=r"\[96, 64\].*outputs of 64"):
        Int4Linear(weights(96, 64), None, torch.float32)


def test_the_probe_runs_each_format_on_cpu_and_refuses_them_on_cuda():
    cpu = {s.format: s for s in weight_format_statuses("cpu")}
    formats = {WeightFormat.INT8, WeightFormat.INT4, WeightFormat.W8A8, WeightFormat.NATIVE}
    assert set(cpu) == formats
    assert all(s.available for s in cpu.values()), cpu
    for status in weight_format_statuses("cuda"):
        assert not status.available
        assert "CPU only" in status.reason and "use dequantized on cuda" in status.reason
