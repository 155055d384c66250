"""w8a8: int8 weights and per-row int8 activations. The compiled steps (quantize, the int8 GEMM
with its dequantize, on VNNI and, where the CPU has them, on AMX tiles) give bit for bit what
their torch forms give; a row's result does not depend on the rest of its batch; smoothing
moves range into the weights without changing the product; and the result stays close to the
float matmul."""

import pytest
import torch
import torch.nn.functional as F
from intentserve.policy import WeightFormat
from intentserve.worker.kernels import KernelUnavailable, fused_ops, int8_gemm_kernel
from intentserve.worker.model import cpu_ops
from intentserve.worker.model.calibration import input_ranges
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.quant_linear import (
    W8A8Linear,
    WeightShapeError,
    dequantize_rows_reference,
    pack_int8,
    quantize_rows_reference,
    smoothing_factors,
    unpack_int8,
)
from intentserve.worker.model.reference_attention import CausalAttention
from intentserve.worker.model.weight_format import held_format, quantize_linears

from tests.worker.model.kernel_paths import HAS_CC, needs_cc, on_path, variant_fixture
from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config

# The variants whose build has AVX512-VNNI (x86-64-v3's refuses the kernel: test_variant_refusals).
kernel_variant = variant_fixture("AVX512-VNNI")


def gemm_or_skip():
    try:
        return int8_gemm_kernel()
    except KernelUnavailable as error:  # no compiler, or a CPU without AVX512-VNNI
        pytest.skip(f"the int8 GEMM kernel is unavailable here: {error.reason}")


@pytest.fixture(params=["AVX512-VNNI", "AMX"])
def int8_gemm(request, kernel_variant):
    """The int8 GEMM on the path the test is for (the AMX one skips, with the reason, on a CPU
    without AMX); the path it was on is restored afterwards."""
    if not HAS_CC:
        pytest.skip("no C compiler (cc, gcc or clang)")
    yield from on_path(gemm_or_skip(), request.param, "AMX-INT8")


def activations(rows, width, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen)
    x[:, 3] *= 40  # an outlier channel, as decoder activations have
    return x.to(dtype)


def weight(out_features, in_features, seed=1):
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed))


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("smoothed", [False, True])
def test_the_compiled_quantize_matches_its_torch_form_bit_for_bit(dtype, smoothed):
    x = activations(37, 576, dtype)
    x[5] = 0  # an all-zero row takes the smallest scale, not a division by zero
    inv = (torch.rand(576, generator=torch.Generator().manual_seed(2)) + 0.5) if smoothed else None
    expected_q, expected_scales = quantize_rows_reference(x, inv)
    q, scales = cpu_ops.quantize_rows(fused_ops(), x, inv)
    assert torch.equal(q, expected_q) and torch.equal(scales, expected_scales)
    assert q.abs().max().item() == 127 and torch.equal(q[5], torch.zeros_like(q[5]))
    unsigned, _ = cpu_ops.quantize_rows(fused_ops(), x, inv, unsigned=True)
    assert unsigned.dtype == torch.uint8
    assert torch.equal(unsigned.to(torch.int16) - 128, expected_q.to(torch.int16))


def test_the_pack_layout_round_trips_and_its_compensation_is_128_times_the_row_sums():
    q = torch.randint(-127, 128, (96, 64), dtype=torch.int8)
    packed, comp = pack_int8(q)
    assert packed.shape == (6, 16, 16, 4)
    # block 1, inputs 8..11, channel 16 + 5: one 64-byte vector holds 4 inputs of 16 channels
    assert torch.equal(packed[1, 2, 5], q[21, 8:12])
    assert torch.equal(unpack_int8(packed), q)
    assert torch.equal(comp, 128 * q.to(torch.int32).sum(dim=1))


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# rows: one stream, tails of 4/2/1 rows, whole 8-row tiles, mixed; channels: groups of 3
# blocks of 16 with and without a short last group; inputs: SmolLM2's widths and a small one
@pytest.mark.parametrize("rows", [1, 3, 7, 8, 13, 17, 32, 40, 64])
@pytest.mark.parametrize(("out_features", "in_features"), [(192, 576), (80, 1536), (48, 32)])
def test_the_int8_gemm_equals_int_mm_then_dequantize_bit_for_bit(
    int8_gemm, dtype, rows, out_features, in_features
):
    gemm = int8_gemm
    gen = torch.Generator().manual_seed(rows)
    q = torch.randint(-127, 128, (rows, in_features), dtype=torch.int8, generator=gen)
    w = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8, generator=gen)
    row_scales = torch.rand(rows, generator=gen) * 1e-2
    col_scales = torch.rand(out_features, generator=gen) * 1e-2
    expected = dequantize_rows_reference(torch._int_mm(q, w.t()), row_scales, col_scales, dtype)
    packed, comp = pack_int8(w)
    a = (q.to(torch.int16) + 128).to(torch.uint8)
    got = cpu_ops.int8_gemm(gemm, a, packed, comp, row_scales, col_scales, dtype)
    assert torch.equal(got, expected)


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_path_and_the_torch_path_give_the_same_bits(int8_gemm, dtype):
    w = weight(192, 576)
    x = activations(21, 576, dtype)
    ranges = activations(64, 576, torch.float32, seed=5).abs().amax(dim=0)
    plain = W8A8Linear(w, None, dtype, ranges)  # torch ops and torch._int_mm
    fast = W8A8Linear(w, None, dtype, ranges)
    fast.fused = fused_ops()
    moved = fast.use_int8_gemm(int8_gemm)
    assert moved and fast.qweight is None and fast.packed is not None  # one copy of the weight
    assert torch.equal(fast(x), plain(x))
    assert torch.equal(fast.dequantize(), plain.dequantize())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_result_does_not_depend_on_the_rest_of_its_batch(dtype):
    module = W8A8Linear(weight(64, 128), None, dtype, None)
    if HAS_CC:
        module.fused = fused_ops()
    batch = activations(24, 128, dtype)
    together = module(batch)
    for i in (0, 7, 23):
        assert torch.equal(module(batch[i : i + 1]), together[i : i + 1])


def test_smoothing_leaves_the_product_unchanged_and_evens_out_an_outlier_channel():
    w = weight(64, 128) * 0.05
    x = activations(16, 128, torch.float32)
    ranges = x.abs().amax(dim=0)
    s = smoothing_factors(ranges, w)
    torch.testing.assert_close(F.linear(x / s, w * s), F.linear(x, w), rtol=1e-4, atol=1e-4)
    smoothed_x = (x / s).abs().amax(dim=0)
    assert smoothed_x.max() / smoothed_x.median() < ranges.max() / ranges.median()
    # And it pays where it matters: the quantized result is closer to the float one.
    error = {
        name: (W8A8Linear(w, None, torch.float32, r)(x) - F.linear(x, w)).abs().mean().item()
        for name, r in (("plain", None), ("smoothed", ranges))
    }
    assert error["smoothed"] < error["plain"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_result_stays_close_to_the_float_matmul(dtype):
    w = weight(96, 256) * 0.05
    x = activations(9, 256, dtype)
    bias = torch.linspace(-0.5, 0.5, 96)
    module = W8A8Linear(w, bias, dtype, x.float().abs().amax(dim=0))
    expected = F.linear(x.float(), w, bias)
    scale = F.linear(x.float(), w).abs().mean().item()
    # per-row int8 activations and per-channel int8 weights: ~1% of the output's magnitude
    assert (module(x).float() - expected).abs().mean().item() < 0.03 * scale


def test_ranges_of_the_wrong_width_are_refused_with_the_shapes():
    with pytest.raises(WeightShapeError, match=r"\(100,\).*\[64, 128\]"):
        W8A8Linear(weight(64, 128), None, torch.float32, torch.ones(100))


@pytest.fixture
def tiny_llama():
    config = tiny_config()
    return LlamaModel.from_hf_weights(config, random_hf_weights(config), torch.float32)


def test_quantizing_to_w8a8_needs_a_calibration_text(tiny_llama):
    with pytest.raises(ValueError, match="w8a8 needs a calibration text"):
        quantize_linears(tiny_llama, WeightFormat.W8A8)
    assert held_format(tiny_llama) is WeightFormat.DEQUANTIZED  # nothing replaced


def test_calibration_records_each_projections_input_range_and_puts_the_model_back(tiny_llama):
    model = tiny_llama
    owners = [
        (layer.mlp, "down_proj", f"layers.{i}.down_proj") for i, layer in enumerate(model.layers)
    ]
    before = [layer.mlp.down_proj for layer in model.layers]
    ranges = input_ranges(model, list(range(5, 40)), owners)
    assert [layer.mlp.down_proj for layer in model.layers] == before
    assert set(ranges) == {key for _, _, key in owners} | {"lm_head"}
    width = model.config.intermediate_size
    assert all(ranges[key].shape == (width,) and ranges[key].max() > 0 for _, _, key in owners)
    assert ranges["lm_head"].shape == (model.config.hidden_size,)


def test_without_the_int8_gemm_the_projections_stay_on_int_mm_and_the_reason_is_given(
    tiny_llama, monkeypatch
):
    def unavailable():
        raise KernelUnavailable("this CPU has no AVX512-VNNI int8 dot products")

    monkeypatch.setattr(cpu_ops, "int8_gemm_kernel", unavailable)
    quantize_linears(tiny_llama, WeightFormat.W8A8, list(range(5, 40)))
    said = cpu_ops.enable_int8_gemm(tiny_llama)
    assert said == "torch._int_mm (this CPU has no AVX512-VNNI int8 dot products)"
    held = [m for m in tiny_llama.modules() if isinstance(m, W8A8Linear)]
    assert held and all(m.gemm is None and m.qweight is not None for m in held)
    ids = torch.tensor([5, 6, 7])
    assert torch.isfinite(tiny_llama(ids, torch.arange(3), CausalAttention(), None)).all()


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 11, 40])
def test_the_one_call_matmul_is_quantize_then_the_gemm(dtype, rows):
    gemm = gemm_or_skip()
    w = weight(96, 576)
    ranges = activations(64, 576, torch.float32, seed=5).abs().amax(dim=0)
    module = W8A8Linear(w, None, dtype, ranges)
    module.use_int8_gemm(gemm)
    x = activations(rows, 576, dtype, seed=rows)
    a, row_scales = cpu_ops.quantize_rows(fused_ops(), x, module.inv_smooth, unsigned=True)
    two_calls = cpu_ops.int8_gemm(
        gemm, a, module.packed, module.comp, row_scales, module.scales, dtype
    )
    one_call = cpu_ops.w8a8_linear(
        gemm, x, module.inv_smooth, module.packed, module.comp, module.scales
    )
    assert torch.equal(one_call, two_calls) and torch.equal(module(x), one_call)
