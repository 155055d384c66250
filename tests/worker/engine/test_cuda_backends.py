"""Every paged backend a CUDA worker has, on the device, against float64 attention over the same
paged blocks: mixed prefill/decode steps over scattered blocks, a banded layer beside a global
one, in the cache dtypes each backend stores. (On a CPU the Triton kernel's same checks run under
the interpreter in test_triton_paged.py; the torch backend's in test_paged_attention_kernels.py.)"""

import pytest
import torch
from intentserve.policy import CacheKind
from intentserve.worker.attention.flash_paged import FlashPagedAttention, flash_status
from intentserve.worker.attention.torch_paged import TorchPagedAttention
from intentserve.worker.cache.kv_pool import KvGeometry, KvPool

from tests.worker.engine.test_triton_paged import BS, check_steps, make_history

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA device; on a CPU test_triton_paged.py runs the Triton kernel under "
        "the interpreter and test_paged_attention_kernels.py the torch backend",
    ),
]
WINDOWS = (None, 5)


def _backend(name, pool):
    if name == "torch":
        return TorchPagedAttention(pool, layer_windows=WINDOWS)
    if name == "flash":
        status = flash_status(torch.device("cuda"))
        if not status.available:
            pytest.skip(f"vllm-flash-attn is not available on this CUDA host: {status.reason}")
        return FlashPagedAttention(pool, layer_windows=WINDOWS)
    from intentserve.worker.attention.triton_paged import TritonPagedAttention

    return TritonPagedAttention(pool, 8, layer_windows=WINDOWS)


@pytest.mark.parametrize(
    "name,kv_dtype",
    [
        ("torch", torch.bfloat16),
        ("torch", torch.float32),
        ("flash", torch.bfloat16),
        ("triton", torch.bfloat16),
        ("triton", torch.float8_e4m3fn),
    ],
    ids=str,
)
def test_backend_matches_float64_attention_on_the_device(name, kv_dtype):
    geometry = KvGeometry(len(WINDOWS), 2, 64, kv_dtype)
    pool = KvPool(CacheKind.PAGED, geometry, 16, BS, torch.device("cuda"))
    backend = _backend(name, pool)
    q_dtype = torch.float32 if kv_dtype == torch.float32 else torch.bfloat16
    history = {s: make_history(12, 8, 2, 64, q_dtype, "cuda") for s in "abc"}
    atol = 1e-4 if q_dtype == torch.float32 else 3e-2
    check_steps(backend, history, WINDOWS, kv_dtype, "cuda", atol=atol)
