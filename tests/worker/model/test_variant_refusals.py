"""The kernel paths a variant's build leaves out on every CPU (kernel_paths.NOT_BUILT): forced to
x86-64-v3, each AVX-512 GEMM is refused by name (its caller keeps its torch or oneDNN path and
says why), and the GGUF kernel serves on its AVX2 dot products, its VNNI ones refused. One test
per kernel here, in place of the kernel's every test skipped there on every host."""

import re

import pytest
from intentserve.worker.kernels import (
    KernelUnavailable,
    bf16_gemm_kernel,
    f32_gemm_kernel,
    gguf_gemm_kernel,
    int8_gemm_kernel,
)
from intentserve.worker.kernels.variants import VARIANT_ENV

from tests.worker.model.kernel_paths import NOT_BUILT, forced_variant, needs_cc

V3 = "x86-64-v3"
# (loader, the path its tests run on, what the refusal names: table.py's isa)
REFUSED = [
    pytest.param(bf16_gemm_kernel, "AVX512-BF16", "AVX512-BF16 dot products", id="bf16_gemm"),
    pytest.param(f32_gemm_kernel, "AVX-512", "AVX-512", id="f32_gemm"),
    pytest.param(int8_gemm_kernel, "AVX512-VNNI", "AVX512-VNNI int8 dot products", id="int8_gemm"),
]
GGUF_VNNI = "AVX512-VNNI"


def test_the_table_of_paths_left_out_is_the_one_these_tests_cover():
    covered = {row.values[1] for row in REFUSED} | {GGUF_VNNI}
    assert {V3: covered} == NOT_BUILT


@needs_cc
@pytest.mark.parametrize(("loader", "path", "isa"), REFUSED)
def test_forced_to_x86_64_v3_an_avx512_gemm_is_refused_naming_the_variant_and_isa(
    loader, path, isa
):
    reason = (
        f"the kernels loaded are built for the {V3} variant (forced by {VARIANT_ENV}), "
        f"which has no {isa}"
    )
    with forced_variant(V3), pytest.raises(KernelUnavailable, match=re.escape(reason)) as refused:
        loader()
    assert refused.value.reason == reason


@needs_cc
def test_forced_to_x86_64_v3_the_gguf_kernel_serves_on_avx2_its_vnni_path_refused():
    with forced_variant(V3):
        kernel = gguf_gemm_kernel()
        was = kernel.vnni(-1)
        try:
            assert kernel.vnni(1) == 0  # the switch answers: not in this build
            assert kernel.isa() == "AVX2"
        finally:
            kernel.vnni(was)
