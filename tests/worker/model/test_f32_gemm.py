"""The float32 projections' kernel (f32_gemm.c, AVX-512 fused multiply-adds): the float32 matmul
up to summation order, a row's result the same whatever else is in its batch, a bias added; and
prepack_linears puts every float32 projection on it, or says why not."""

import pytest
import torch
import torch.nn.functional as F
from intentserve.worker.kernels import KernelUnavailable, f32_gemm_kernel
from intentserve.worker.model import packed_linear
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.packed_linear import F32Linear, PackedLinear, prepack_linears

from tests.worker.model.kernel_paths import built_or_skip, variant_fixture
from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config

# The variants whose build has AVX-512 (x86-64-v3's refuses the kernel: test_variant_refusals).
kernel_variant = variant_fixture("AVX-512")


@pytest.fixture(scope="module")
def gemm(kernel_variant):
    return built_or_skip(f32_gemm_kernel, "float32 GEMM kernel")


def operands(rows, out_features, in_features, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=gen)
    w = torch.randn(out_features, in_features, generator=gen) * 0.05
    bias = torch.randn(out_features, generator=gen)
    return x, w, bias


def within_float32_sums(got, x, w, bias):
    """|got - exact| within what float32 sums in any order can differ by: k ulps of the sum of
    the products' magnitudes (a standard bound), plus the bias's rounding."""
    exact = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    magnitude = F.linear(x.double().abs(), w.double().abs()) + (0 if bias is None else bias.abs())
    bound = x.shape[1] * 2**-24 * magnitude + 1e-30
    return ((got.double() - exact).abs() <= bound).all()


# rows: one stream, tails of 4/2/1, whole 8-row tiles and mixes; channels in groups of 3 blocks
# of 16, with and without a short last group (of 2 blocks, of 1); SmolLM2's widths, an odd k and
# small ones
SHAPES = [(960, 576), (80, 1536), (48, 33), (64, 33)]


@pytest.mark.parametrize("rows", [1, 3, 7, 8, 13, 17, 32, 40, 64])
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_the_kernel_is_the_float32_matmul(gemm, rows, out_features, in_features):
    x, w, bias = operands(rows, out_features, in_features)
    got = F32Linear(w, bias, gemm)(x)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    assert within_float32_sums(got, x, w, bias)
    torch.testing.assert_close(got, F.linear(x, w, bias), rtol=1e-5, atol=1e-5)


def test_without_a_bias_and_over_two_megabytes_of_output(gemm):
    """The LM head: no bias; at 32 rows of 16,432 channels the output is over 2 MB and written
    with streamed stores."""
    x, w, _ = operands(32, 16384 + 48, 576, seed=7)
    got = F32Linear(w, None, gemm)(x)
    assert within_float32_sums(got, x, w, None)


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_a_rows_result_does_not_depend_on_the_rest_of_its_batch(gemm, out_features, in_features):
    x, w, bias = operands(64, out_features, in_features, seed=3)
    module = F32Linear(w, bias, gemm)
    together = module(x)
    for start, stop in ((0, 1), (5, 6), (8, 16), (13, 37), (16, 48), (63, 64)):
        assert torch.equal(module(x[start:stop]), together[start:stop])


def test_the_packed_weight_unpacks_to_the_weight_and_other_inputs_still_get_the_right_answer(
    gemm,
):
    x, w, bias = operands(5, 112, 64)  # two groups of 3 blocks and one of 1
    module = F32Linear(w, bias, gemm)
    assert torch.equal(module.weight(), w)
    as_double = module(x.double())  # not what the model sends: the torch fallback
    assert as_double.dtype == torch.float64
    torch.testing.assert_close(as_double, F.linear(x.double(), w.double(), bias.double()))


def tiny(dtype):
    config = tiny_config()
    return LlamaModel.from_hf_weights(config, random_hf_weights(config), dtype)


def test_prepack_puts_every_float32_projection_and_the_head_on_the_kernel(gemm):
    model = tiny(torch.float32)
    said = prepack_linears(model)
    projections = [m for m in model.modules() if isinstance(m, F32Linear)]
    assert said == f"float32 GEMM kernel (AVX-512), all {len(projections)}"
    assert len(projections) == 4 * len(model.layers) + 1
    assert prepack_linears(model) == said  # idempotent
    hidden = torch.randn(3, model.config.hidden_size)
    assert model.compute_logits(hidden).dtype == torch.float32


def test_prepack_keeps_onednn_for_float32_when_turned_off_or_the_kernel_is_missing(monkeypatch):
    model = tiny(torch.float32)
    assert prepack_linears(model, kernels=False) == (
        "oneDNN packed (the GEMM kernels were turned off)"
    )
    assert not any(isinstance(m, F32Linear) for m in model.modules())

    def unavailable():
        raise KernelUnavailable("this CPU has no AVX-512")

    monkeypatch.setattr(packed_linear, "f32_gemm_kernel", unavailable)
    model = tiny(torch.float32)
    assert prepack_linears(model) == "oneDNN packed (this CPU has no AVX-512)"
    assert sum(isinstance(m, PackedLinear) for m in model.modules()) == 4 * len(model.layers) + 1
