"""The K-quants (Q4_K, Q5_K, Q6_K) interleaved 8 output channels at a time (gguf_kx8.h), against
gguf's own dequantization: the layout keeps the file's bytes, dequantizes to gguf's values bit
for bit, and its matmuls (one row and batches, on the VNNI and the AVX2 dot products alike) are
within the activations' int8 rounding; on random blocks of odd shapes and Gemma 3's real
tensors."""

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from intentserve.worker.model.gguf_linear import (
    GgufBlocks,
    NativeLinear,
    dequantize_blocks,
    interleave,
)
from intentserve.worker.model.gguf_loader import open_gguf

from tests.worker.model import test_gguf_gemm
from tests.worker.model.test_gguf_gemm import (
    blocks_of,
    quantized_activations,
    random_blocks,
    reference,
)

kernel = test_gguf_gemm.kernel  # the fixture: the kernel on its VNNI, then its AVX2 dot products

K_QUANTS = (QType.Q4_K, QType.Q5_K, QType.Q6_K)


def check_matmul(kernel, blocks: GgufBlocks, w: torch.Tensor, rows: int, seed: int) -> None:
    """`blocks` (w, dequantized) interleaved, their matmul on `rows` rows within the float32
    summation order of the same products from the int8-rounded activations."""
    module = NativeLinear([blocks], None, kernel)
    assert module.parts[0].interleaved
    x = torch.randn(rows, blocks.cols, generator=torch.Generator().manual_seed(seed))
    got = module(x).double()
    w = w.double()
    expected = quantized_activations(x).double() @ w.T
    scale = (x.abs().double() @ w.abs().T).clamp(min=1e-6)
    assert ((got - expected).abs() / scale).max() < 1e-5
    assert ((got - x.double() @ w.T).abs() / scale).max() < 1e-2


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda q: q.name)
def test_interleaved_k_quants_keep_the_file_bytes(kernel, qtype):
    """24 channels (3 groups) of 3 super-blocks: the same bytes rearranged (resident bytes are
    the file's), gguf's values whole and row by row."""
    data = random_blocks(qtype, 24, 768, seed=7)
    blocks = interleave(kernel, blocks_of(qtype, data, 768))
    assert blocks.interleaved and blocks.data.shape == data.shape
    assert blocks.data.nbytes == data.nbytes
    assert not torch.equal(blocks.data, torch.from_numpy(data))
    assert torch.equal(
        blocks.data.flatten().sort().values, torch.from_numpy(data).flatten().sort().values
    )
    expected = reference(qtype, data)
    assert torch.equal(dequantize_blocks(kernel, blocks, torch.float32), expected)
    rows = torch.tensor([23, 0, 9, 16])
    assert torch.equal(dequantize_blocks(kernel, blocks, torch.float32, rows), expected[rows])


@pytest.mark.parametrize(("n", "k"), [(8, 256), (24, 768), (40, 512)])
@pytest.mark.parametrize("rows", [1, 3, 8, 32, 64])
@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda q: q.name)
def test_interleaved_k_quant_matmul(kernel, qtype, rows, n, k):
    data = random_blocks(qtype, n, k, seed=rows + n)
    check_matmul(kernel, blocks_of(qtype, data, k), reference(qtype, data), rows, seed=rows)


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda q: q.name)
def test_k_quant_matmul_shared_out_to_the_threads(kernel, qtype):
    """16 x 520 x 1024 multiply-adds, past the threshold for a parallel region: 65 groups (an
    odd count) taken by 2 threads."""
    data = random_blocks(qtype, 520, 1024, seed=5)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        check_matmul(kernel, blocks_of(qtype, data, 1024), reference(qtype, data), 16, seed=5)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.model
@pytest.mark.parametrize(
    ("name", "qtype"),
    [("blk.0.attn_output.weight", QType.Q4_K), ("blk.0.ffn_down.weight", QType.Q6_K)],
)
def test_gemma3_tensors(kernel, gemma3_path, name, qtype):
    """Gemma 3 270M's Q4_K_M file: a Q4_K and a Q6_K tensor as the file writes them."""
    t = open_gguf(gemma3_path).stored(name)
    assert t.tensor_type == qtype
    cols, n = int(t.shape[0]), int(np.prod(t.shape[1:]))
    data = np.array(t.data, dtype=np.uint8).reshape(n, -1)
    w = torch.from_numpy(np.array(gguf.quants.dequantize(data, qtype), dtype=np.float32))
    blocks = interleave(kernel, blocks_of(qtype, data, cols))
    assert blocks.interleaved and blocks.data.nbytes == data.nbytes
    assert torch.equal(dequantize_blocks(kernel, blocks, torch.float32), w)
    for rows in (1, 8, 33):
        check_matmul(kernel, blocks_of(qtype, data, cols), w, rows, seed=rows)
