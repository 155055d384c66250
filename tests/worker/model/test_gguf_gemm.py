"""gguf_gemm.c against gguf's own dequantization, for every type `weights: native` holds: the
blocks dequantized bit for bit, and matmuls within the rounding of the activations' int8 (one
scale per 32 values), on the VNNI and the AVX2 dot products alike (the same integer sums)."""

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from intentserve.worker.kernels import gguf_gemm_kernel
from intentserve.worker.model.gguf_linear import (
    INTERLEAVED_TYPES,
    NATIVE_TYPES,
    GgufBlocks,
    NativeEmbedding,
    NativeLinear,
    dequantize_blocks,
    interleave,
)

from tests.worker.model.kernel_paths import built_or_skip, forced_variant, variants_with

# gguf.quants.quantize writes these
QUANTIZABLE = (QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0)
# Where each type keeps its float16 scales (byte offsets in a block): random bytes there could
# be inf or NaN, so the tests write finite ones.
_HALF_FIELDS = {
    QType.Q4_0: (0,),
    QType.Q4_1: (0, 2),
    QType.Q5_0: (0,),
    QType.Q5_1: (0, 2),
    QType.Q8_0: (0,),
    QType.Q4_K: (0, 2),
    QType.Q5_K: (0, 2),
    QType.Q6_K: (208,),
}


# (path, variant): the kernel on its VNNI, then its AVX2 dot products, on each ISA variant whose
# build has the path (x86-64-v3's has no VNNI ones: test_variant_refusals).
RUNS = [(path, variant) for path in ("AVX512-VNNI", "AVX2") for variant in variants_with(path)]


@pytest.fixture(scope="module", params=RUNS, ids="-".join)
def kernel(request):
    path, variant = request.param
    with forced_variant(variant):
        kernel = built_or_skip(gguf_gemm_kernel, "GGUF GEMM kernel")
        was = kernel.vnni(-1)
        if path == "AVX512-VNNI" and not kernel.vnni(1):
            pytest.skip("this CPU has no VNNI dot products")
        if path == "AVX2":
            kernel.vnni(0)
        assert kernel.isa() == path
        yield kernel
        kernel.vnni(was)


def random_blocks(qtype: QType, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """[rows, row bytes] of random blocks of `qtype`, the scales finite and small."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for offset in _HALF_FIELDS[qtype]:
        halves = rng.uniform(-0.02, 0.02, size=(rows, cols // block)).astype(np.float16)
        data[..., offset : offset + 2] = halves.view(np.uint8).reshape(rows, cols // block, 2)
    return data.reshape(rows, -1)


def blocks_of(qtype: QType, data: np.ndarray, cols: int) -> GgufBlocks:
    return GgufBlocks(qtype, torch.from_numpy(np.ascontiguousarray(data)), cols)


def reference(qtype: QType, data: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(gguf.quants.dequantize(data, qtype), dtype=np.float32))


@pytest.mark.parametrize("qtype", NATIVE_TYPES, ids=lambda q: q.name)
def test_dequantize_matches_gguf_bit_for_bit(kernel, qtype):
    data = random_blocks(qtype, 5, 512)
    got = dequantize_blocks(kernel, blocks_of(qtype, data, 512), torch.float32)
    assert torch.equal(got, reference(qtype, data))
    rows = torch.tensor([4, 0, 4])
    picked = dequantize_blocks(kernel, blocks_of(qtype, data, 512), torch.float32, rows)
    assert torch.equal(picked, reference(qtype, data)[rows])


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """x rounded as the kernel rounds it: int8 with one scale per 32 values (float32)."""
    groups = x.float().reshape(x.shape[0], -1, 32)
    scale = groups.abs().amax(-1, keepdim=True) / 127
    q = torch.round(groups / torch.where(scale > 0, scale, 1))
    return (q * scale).reshape(x.shape)


@pytest.mark.parametrize("qtype", INTERLEAVED_TYPES, ids=lambda q: q.name)
def test_interleaved_blocks_are_the_file_bytes_rearranged(kernel, qtype):
    """Eight channels' blocks interleaved (one vector load serves eight channels): the same
    bytes in another order, which dequantize to gguf's values, whole or row by row."""
    data = random_blocks(qtype, 24, 256)
    blocks = interleave(kernel, blocks_of(qtype, data, 256))
    assert blocks.interleaved and blocks.data.shape == data.shape
    assert not torch.equal(blocks.data, torch.from_numpy(data))
    assert torch.equal(
        blocks.data.flatten().sort().values, torch.from_numpy(data).flatten().sort().values
    )
    assert interleave(kernel, blocks) is blocks
    expected = reference(qtype, data)
    assert torch.equal(dequantize_blocks(kernel, blocks, torch.float32), expected)
    rows = torch.tensor([17, 0, 9, 23])
    assert torch.equal(dequantize_blocks(kernel, blocks, torch.float32, rows), expected[rows])


@pytest.mark.parametrize("qtype", NATIVE_TYPES, ids=lambda q: q.name)
def test_which_blocks_are_interleaved(kernel, qtype):
    """The types with an interleaved kernel, where the channels come in whole groups of 8;
    every other type or width keeps the file's order."""
    assert interleave(kernel, blocks_of(qtype, random_blocks(qtype, 16, 256), 256)).interleaved == (
        qtype in INTERLEAVED_TYPES
    )
    assert not interleave(kernel, blocks_of(qtype, random_blocks(qtype, 12, 256), 256)).interleaved


@pytest.mark.parametrize("n", [40, 44, 48])
@pytest.mark.parametrize("rows", [1, 3, 8, 19, 40])
@pytest.mark.parametrize("qtype", NATIVE_TYPES, ids=lambda q: q.name)
def test_matmul_matches_gguf_dequantized_weights(kernel, qtype, rows, n):
    """n = 48: six groups of 8 channels (interleaved where the type has it; with AVX-512, three
    pairs of groups in 512-bit vectors), 40: five (the last group alone), 44: not whole groups
    (the file's order). 19 and 40 rows: passes of 8 rows and a shorter last one."""
    k = 512
    data = random_blocks(qtype, n, k, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    module = NativeLinear([blocks_of(qtype, data, k)], None, kernel)
    assert module.parts[0].interleaved == (qtype in INTERLEAVED_TYPES and n % 8 == 0)
    got = module(x)
    w = reference(qtype, data).double()
    # The same products in float64, from the activations the kernel rounds to int8: what is
    # left is float32 summation order.
    expected = quantized_activations(x).double() @ w.T
    scale = (x.abs().double() @ w.abs().T).clamp(min=1e-6)
    assert ((got.double() - expected).abs() / scale).max() < 1e-5
    # Against the float activations: the int8 rounding, a few parts in a thousand of |x| |w|.
    assert ((got.double() - x.double() @ w.T).abs() / scale).max() < 1e-2


@pytest.mark.parametrize("qtype", [QType.Q4_1, QType.Q6_K], ids=lambda q: q.name)
def test_a_matmul_shared_out_to_the_threads(kernel, qtype):
    """8 x 520 x 1024 multiply-adds, past the kernel's threshold for a parallel region (4M): the
    channel groups taken by 2 threads (520: 65 groups, an odd count), each written once."""
    n, k, rows = 520, 1024, 8
    data = random_blocks(qtype, n, k, seed=5)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(5))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = NativeLinear([blocks_of(qtype, data, k)], None, kernel)(x)
    finally:
        torch.set_num_threads(threads)
    w = reference(qtype, data).double()
    expected = quantized_activations(x).double() @ w.T
    scale = (x.abs().double() @ w.abs().T).clamp(min=1e-6)
    assert ((got.double() - expected).abs() / scale).max() < 1e-5


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda q: q.name)
def test_blocks_written_by_gguf_quantize(kernel, qtype):
    """Blocks as gguf's own quantizer writes them (real values, not random bytes)."""
    w = np.random.default_rng(1).standard_normal((48, 256)).astype(np.float32)
    data = gguf.quants.quantize(w, qtype)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(2))
    got = NativeLinear([blocks_of(qtype, data, 256)], None, kernel)(x)
    expected = quantized_activations(x).double() @ reference(qtype, data).double().T
    assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-4)


def test_fused_parts_of_different_types_and_bf16(kernel):
    """q|k|v whose parts the file keeps in different types, each writing its own columns."""
    k = 256
    parts = [
        blocks_of(QType.Q4_K, random_blocks(QType.Q4_K, 32, k, 1), k),
        blocks_of(QType.Q6_K, random_blocks(QType.Q6_K, 16, k, 2), k),
        blocks_of(QType.Q8_0, random_blocks(QType.Q8_0, 16, k, 3), k),
    ]
    bias = torch.randn(64)
    module = NativeLinear(parts, bias, kernel)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(4))
    w = torch.cat([reference(p.qtype, p.data.numpy()) for p in parts])
    expected = quantized_activations(x) @ w.T + bias
    assert torch.allclose(module(x), expected, rtol=1e-4, atol=1e-4)
    got = module(x.bfloat16())
    assert got.dtype == torch.bfloat16
    expected_bf16 = quantized_activations(x.bfloat16()) @ w.T + bias
    assert torch.allclose(got.float(), expected_bf16, rtol=2e-2, atol=2e-2)
    assert torch.equal(module.dequantize(), w)


@pytest.mark.parametrize(("qtype", "num_tokens"), [(QType.Q6_K, 10), (QType.Q8_0, 16)])
def test_embedding_rows_and_range(kernel, qtype, num_tokens):
    """Q8_0 [16, 256]: a table interleaved as a tied head's (one buffer serves both)."""
    data = random_blocks(qtype, num_tokens, 256)
    table = interleave(kernel, blocks_of(qtype, data, 256))
    embedding = NativeEmbedding(table, kernel, torch.float32)
    ids = torch.tensor([[3, 9], [0, 3]])
    assert torch.equal(embedding(ids), reference(qtype, data)[ids])
    head = NativeLinear([table], None, kernel, torch.float32)
    assert head.parts[0].data.data_ptr() == embedding.blocks.data_ptr()
    with pytest.raises(IndexError, match=rf"\[0, {num_tokens}\)"):
        embedding(torch.tensor([num_tokens]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_activations_quantized_per_32_values(kernel, dtype):
    """q = x / d rounded to the nearest, ties to even (torch.round), d = max|x| / 127 per 32
    values, s = d * sum(q); a block of zeros has d = 0. Ties are planted: 0.5 and 2.5 times d."""
    rows, k = 3, 128
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(7)).to(dtype)
    x[1, 32:64] = 0
    x[2, :32] = torch.tensor([127.0, 0.5, 2.5, -0.5, -2.5] + [1.0] * 27, dtype=dtype)
    q = torch.empty(rows, k, dtype=torch.int8)
    scales = torch.empty(2, rows, k // 32)  # d, then s
    kernel.quantize_rows(
        x.data_ptr(),
        rows,
        k,
        int(dtype == torch.bfloat16),
        q.data_ptr(),
        scales[0].data_ptr(),
        scales[1].data_ptr(),
    )
    groups = x.float().reshape(rows, -1, 32)
    scale = groups.abs().amax(-1) / 127
    expected = torch.round(groups / torch.where(scale > 0, scale, 1)[..., None])
    assert torch.equal(q.reshape(rows, -1, 32).float(), expected)
    assert torch.equal(scales[0], scale)
    assert torch.equal(scales[1], scale * expected.sum(-1))
    assert q[2, :5].tolist() == [127, 0, 2, 0, -2]
