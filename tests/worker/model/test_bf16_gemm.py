"""The bf16 projections' kernel (bf16_gemm.c, on AVX512-BF16 and, where the CPU has them, on AMX
tiles): as close to the float32 matmul as one bfloat16 rounding allows, a row's result the same
whatever else is in its batch, a bias added before the rounding; and prepack_linears puts every
projection on it, or says why not. Every kernel test runs on both paths; the AMX one skips, with
the reason, on a CPU without AMX."""

import pytest
import torch
import torch.nn.functional as F
from intentserve.worker.kernels import KernelUnavailable, bf16_gemm_kernel
from intentserve.worker.model import dtype as dtype_module
from intentserve.worker.model import packed_linear
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.packed_linear import Bf16Linear, PackedLinear, prepack_linears

from tests.worker.model.kernel_paths import built_or_skip, on_path, variant_fixture
from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config

# The variants whose build has AVX512-BF16 (x86-64-v3's refuses the kernel: test_variant_refusals).
kernel_variant = variant_fixture("AVX512-BF16")


@pytest.fixture(scope="module")
def kernel(kernel_variant):
    return built_or_skip(bf16_gemm_kernel, "bf16 GEMM kernel")


@pytest.fixture(params=["AVX512-BF16", "AMX"])
def gemm(request, kernel):
    """The kernel, on the path the test is for; the path it was on is restored afterwards."""
    yield from on_path(kernel, request.param, "AMX-BF16")


def operands(rows, out_features, in_features, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=gen).bfloat16()
    w = (torch.randn(out_features, in_features, generator=gen) * 0.05).bfloat16()
    bias = torch.randn(out_features, generator=gen)
    return x, w, bias


# rows: one stream, tails of 4/2/1, whole 8-row tiles and mixes; channels in groups of 3 blocks
# of 16, with and without a short last group (of 2 blocks, of 1); SmolLM2's widths and small ones
SHAPES = [(960, 576), (80, 1536), (48, 34), (64, 32)]


@pytest.mark.parametrize("rows", [1, 3, 7, 8, 13, 17, 32, 40, 64])
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_the_kernel_is_the_float32_matmul_rounded_once_to_bfloat16(
    gemm, rows, out_features, in_features
):
    x, w, bias = operands(rows, out_features, in_features)
    got = Bf16Linear(w, bias, gemm)(x)
    exact = F.linear(x.float(), w.float(), bias)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    # float32 sums in another order than torch's, then one rounding: within one bf16 step
    step = exact.abs().clamp(min=2**-20) * 2**-7
    assert ((got.float() - exact).abs() <= step + 1e-5).all()


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_a_rows_result_does_not_depend_on_the_rest_of_its_batch(gemm, out_features, in_features):
    x, w, bias = operands(64, out_features, in_features, seed=3)
    module = Bf16Linear(w, bias, gemm)
    together = module(x)
    for start, stop in ((0, 1), (5, 6), (8, 16), (13, 37), (16, 48), (63, 64)):
        assert torch.equal(module(x[start:stop]), together[start:stop])


@pytest.mark.parametrize("rows", [1, 5, 8, 13, 64])
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_a_weight_packed_in_either_order_gives_the_same_bits(
    kernel, monkeypatch, rows, out_features, in_features
):
    # grouped where the calls run on AVX512-BF16, in blocks where they run on AMX tiles; a
    # weight packed in blocks still runs on AVX512-BF16 when the tiles are switched off
    x, w, bias = operands(rows, out_features, in_features, seed=5)
    was = kernel.amx(0)
    try:
        grouped = Bf16Linear(w, bias, kernel)
        monkeypatch.setattr(Bf16Linear, "_grouped", staticmethod(lambda gemm: False))
        in_blocks = Bf16Linear(w, bias, kernel)
    finally:
        kernel.amx(was)
    assert grouped.grouped and not in_blocks.grouped
    assert not torch.equal(grouped.packed, in_blocks.packed)
    kernel.amx(0)
    try:
        assert torch.equal(grouped(x), in_blocks(x))
        assert torch.equal(grouped.weight(), w) and torch.equal(in_blocks.weight(), w)
    finally:
        kernel.amx(was)


def test_amx_off_by_environment_keeps_the_avx512_path(kernel, monkeypatch):
    was = kernel.amx(-1)
    monkeypatch.setenv("INTENTSERVE_AMX", "0")
    try:
        assert bf16_gemm_kernel().isa() == "AVX512-BF16"
        assert "(AVX512-BF16)" in prepack_linears(tiny(torch.bfloat16))
    finally:
        kernel.amx(was)


def test_the_packed_weight_unpacks_to_the_weight_and_other_inputs_still_get_the_right_answer(
    gemm,
):
    x, w, bias = operands(5, 112, 64)  # two groups of 3 blocks and one of 1
    module = Bf16Linear(w, bias, gemm)
    assert torch.equal(module.weight(), w)
    as_float = module(x.float())  # float32 input: the torch fallback, in float32
    torch.testing.assert_close(as_float, F.linear(x.float(), w.float(), bias), rtol=0, atol=1e-4)


def tiny(dtype):
    config = tiny_config()
    return LlamaModel.from_hf_weights(config, random_hf_weights(config), dtype)


def test_prepack_puts_every_bf16_projection_and_the_head_on_the_kernel(gemm):
    model = tiny(torch.bfloat16)
    said = prepack_linears(model)
    projections = [m for m in model.modules() if isinstance(m, Bf16Linear)]
    assert said == f"bf16 GEMM kernel ({gemm.isa()}), all {len(projections)}"
    assert len(projections) == 4 * len(model.layers) + 1
    assert prepack_linears(model) == said  # idempotent


ONEDNN_PACKS_BF16, ONEDNN_BF16_LACKS = dtype_module.cpu_packs_bf16_for_onednn()


def no_bf16_kernel():
    raise KernelUnavailable("this CPU has no AVX512-BF16 dot products")


@pytest.mark.skipif(not ONEDNN_PACKS_BF16, reason=f"this CPU: {ONEDNN_BF16_LACKS}")
def test_prepack_keeps_onednn_when_turned_off_and_where_the_kernel_is_missing(monkeypatch):
    model = tiny(torch.bfloat16)
    assert "turned off" in prepack_linears(model, kernels=False)
    assert not any(isinstance(m, Bf16Linear) for m in model.modules())

    monkeypatch.setattr(packed_linear, "bf16_gemm_kernel", no_bf16_kernel)
    model = tiny(torch.bfloat16)
    assert prepack_linears(model) == "oneDNN packed (this CPU has no AVX512-BF16 dot products)"
    assert sum(isinstance(m, PackedLinear) for m in model.modules()) == 4 * len(model.layers) + 1


def test_bf16_projections_keep_their_plain_weight_where_onednn_cannot_pack_bf16(monkeypatch):
    """An AVX2-only CPU (Zen 3): neither the kernel nor oneDNN's bf16 reorder (which would raise)
    runs there, so every projection stays on F.linear, said so, and the model still computes."""
    monkeypatch.setattr(dtype_module, "cpu_flags", lambda: frozenset({"avx", "avx2", "fma"}))
    monkeypatch.setattr(packed_linear, "bf16_gemm_kernel", no_bf16_kernel)
    model = tiny(torch.bfloat16)
    hidden = torch.randn(3, model.config.hidden_size).bfloat16()
    expected = model.compute_logits(hidden)
    said = prepack_linears(model)
    assert said == (
        "torch F.linear (this CPU has no AVX512-BF16 dot products; "
        "oneDNN packs bf16 only with avx_ne_convert or avx512bw+avx512vl+avx512dq)"
    )
    assert not any(isinstance(m, PackedLinear | Bf16Linear) for m in model.modules())
    assert prepack_linears(model) == said  # idempotent
    assert torch.equal(model.compute_logits(hidden), expected)


@pytest.mark.parametrize(
    ("flags", "packs"),
    [
        (frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}), True),
        (frozenset({"avx2", "avx_ne_convert"}), True),
        (frozenset({"avx2", "avx512f", "avx512bw", "avx512vl"}), False),
        (frozenset({"avx", "avx2", "fma"}), False),
    ],
)
def test_onednn_packs_bf16_with_avx_ne_convert_or_the_three_avx512_flags(monkeypatch, flags, packs):
    monkeypatch.setattr(dtype_module, "cpu_flags", lambda: flags)
    assert dtype_module.cpu_packs_bf16_for_onednn()[0] is packs


@pytest.mark.parametrize(
    "rows,out_features",
    [(1, 96), (8, 96), (13, 96), (32, 16384 + 48)],  # the last: over 2 MB, streamed stores
)
def test_float32_output_keeps_the_sums_unrounded(gemm, rows, out_features):
    x, w, bias = operands(rows, out_features, 576, seed=7)
    rounded = Bf16Linear(w, bias, gemm)(x)
    exact = Bf16Linear(w, bias, gemm, out_dtype=torch.float32)(x)
    reference = F.linear(x.float(), w.float(), bias)
    assert exact.dtype == torch.float32
    torch.testing.assert_close(exact, reference, rtol=1e-5, atol=1e-5)  # summation order only
    assert torch.equal(exact.bfloat16(), rounded)  # the same sums, rounded once


def test_an_output_dtype_the_kernel_cannot_write_is_refused(gemm):
    with pytest.raises(ValueError, match="out_dtype: torch.float16 is not one of"):
        Bf16Linear(torch.zeros(16, 16, dtype=torch.bfloat16), None, gemm, torch.float16)


def test_the_packed_head_hands_float32_logits_to_the_sampler(gemm):
    model = tiny(torch.bfloat16)
    prepack_linears(model)
    assert model.lm_head.out_dtype == torch.float32
    assert all(layer.mlp.down_proj.out_dtype == torch.bfloat16 for layer in model.layers)
    hidden = torch.randn(3, model.config.hidden_size).bfloat16()
    assert model.compute_logits(hidden).dtype == torch.float32
