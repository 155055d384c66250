"""The triton_paged backend against attention in float64 over the same paged blocks.

On a CPU the kernels run under Triton's interpreter (the same Python the GPU compiles); on a CUDA
host the `gpu` variants run the compiled kernels on the device. Steps mix prefill chunks and
decodes over deliberately scattered blocks; layers may be banded (Gemma 3); the pool may be fp8.
"""

import pytest
import torch
from intentserve.policy import CacheKind
from intentserve.worker.attention.batch import build_step_batch
from intentserve.worker.attention.triton_paged import (
    TritonPagedAttention,
    cut_tiles,
    triton_status,
)
from intentserve.worker.cache.kv_pool import KvGeometry, KvPool
from intentserve.worker.sched.scheduler_output import ScheduledSeq

from tests.worker.engine.reference import float64_attention

triton_kernels = pytest.importorskip(
    "intentserve.worker.attention.triton_kernels",
    reason="triton is not installed (it is in the project's test extra)",
)

BS = 4
CUDA = torch.cuda.is_available()
DEVICES = [
    pytest.param(
        "cpu",
        id="interpreter",
        # tests/conftest.py switches the interpreter on only where no CUDA device is present: it
        # is chosen once, when triton is first imported, for the whole process.
        marks=pytest.mark.skipif(
            CUDA,
            reason="Triton's interpreter is off here: a CUDA host compiles the kernels for the "
            "device (the cuda parameters)",
        ),
    ),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(
                not CUDA,
                reason="needs a CUDA device; the same kernel runs on CPU under the interpreter",
            ),
        ],
    ),
]


def kernels_for(device):
    """On a CPU host tests/conftest.py switched the interpreter on before triton was imported."""
    kernels = triton_kernels.load_kernels()
    assert kernels.interpreted == (device == "cpu"), kernels.impl
    return kernels


def make_history(length, heads, kv_heads, head_dim, dtype, device):
    def r(h):
        return torch.randn(length, h, head_dim).to(device=device, dtype=dtype)

    return r(heads), r(kv_heads), r(kv_heads)


def run_step(backend, scheduled, history, layer_idx, device):
    batch = build_step_batch(scheduled, backend.pool.block_size, torch.device(device))
    meta = backend.prepare(batch)
    parts = [[], [], []]
    for item in scheduled:
        for part, t in zip(parts, history[item.seq_id], strict=True):
            part.append(t[item.start_pos : item.num_context_tokens])
    q, k, v = (torch.cat(p) for p in parts)
    out = backend.forward(layer_idx, q, k, v, meta)
    return dict(zip([s.seq_id for s in scheduled], out.split(batch.query_lens), strict=True))


TABLES = {"a": (5, 1, 7, 11), "b": (0, 2, 9), "c": (3, 4, 12)}  # scattered on purpose


def item(seq_id, start, end):
    return ScheduledSeq(seq_id, start, tuple(range(end - start)), True, block_table=TABLES[seq_id])


STEPS = [
    [item("a", 0, 10), item("b", 0, 3)],  # a whole prefill and a first chunk
    [item("a", 10, 11), item("b", 3, 8), item("c", 0, 6)],  # a decode, a later chunk, a prefill
    [item("a", 11, 12), item("b", 8, 9), item("c", 6, 7)],  # decodes only (the small tiles)
]


def check_steps(backend, history, windows, kv_dtype, device, atol):
    """Every step's outputs, each layer, against float64 attention over the K/V as stored."""
    for step in STEPS:
        for layer, window in enumerate(windows):
            outs = run_step(backend, step, history, layer, device)
            for s in step:
                q, k, v = history[s.seq_id]
                n = s.num_context_tokens
                stored_k, stored_v = (t[:n].to(kv_dtype) for t in (k, v))  # as the pool rounds
                expected = float64_attention(q[s.start_pos : n], stored_k, stored_v, window)
                got = outs[s.seq_id].double()
                torch.testing.assert_close(got, expected, atol=atol, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim",
    [(6, 2, 16), (9, 3, 64), (4, 1, 48)],  # group 3 pads to 4; head_dim 48 pads to 64
    ids=["gqa3", "smollm2-heads", "mqa-d48"],
)
def test_mixed_steps_match_float64_attention(device, heads, kv_heads, head_dim):
    geometry = KvGeometry(2, kv_heads, head_dim, torch.float32)
    pool = KvPool(CacheKind.PAGED, geometry, 16, BS, torch.device(device))
    backend = TritonPagedAttention(pool, heads, kernels=kernels_for(device))
    history = {s: make_history(12, heads, kv_heads, head_dim, torch.float32, device) for s in "abc"}
    check_steps(backend, history, (None, None), torch.float32, device, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_banded_layers_beside_global_ones(device):
    """Gemma 3's shape: local layers with bands shorter than the prompts beside global ones."""
    windows = (5, None, 3)
    geometry = KvGeometry(len(windows), 2, 16, torch.float32)
    pool = KvPool(CacheKind.PAGED, geometry, 16, BS, torch.device(device))
    backend = TritonPagedAttention(pool, 6, layer_windows=windows, kernels=kernels_for(device))
    history = {s: make_history(12, 6, 2, 16, torch.float32, device) for s in "abc"}
    check_steps(backend, history, windows, torch.float32, device, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16], ids=str
)
def test_narrow_kv_cache_matches_float64_over_the_stored_values(device, kv_dtype):
    """The pool rounds K/V to its dtype as it stores them; attention is then exact up to the
    query's dtype (bf16 queries and their products)."""
    geometry = KvGeometry(1, 2, 32, kv_dtype)
    pool = KvPool(CacheKind.PAGED, geometry, 16, BS, torch.device(device))
    backend = TritonPagedAttention(pool, 4, kernels=kernels_for(device))
    history = {s: make_history(12, 4, 2, 32, torch.bfloat16, device) for s in "abc"}
    check_steps(backend, history, (None,), kv_dtype, device, atol=3e-2)
    stored = pool.flat(0)[0][[t * BS + p for t, p in ((5, 0), (5, 1))]]
    assert stored.dtype == kv_dtype
    torch.testing.assert_close(stored, history["a"][1][:2].to(kv_dtype), atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_negative_slots_write_nothing(device):
    """A captured batch pads with slot -1: those rows must leave the pool untouched."""
    geometry = KvGeometry(1, 2, 16, torch.float32)
    pool = KvPool(CacheKind.PAGED, geometry, 4, BS, torch.device(device))
    backend = TritonPagedAttention(pool, 4, kernels=kernels_for(device))
    k_flat, v_flat = pool.flat(0)
    k_flat.fill_(7.0), v_flat.fill_(7.0)
    k = torch.randn(3, 2, 16, device=device)
    slots = torch.tensor([5, -1, 2], device=device)
    backend.store(0, k, k, slots)
    expected = torch.full_like(k_flat, 7.0)
    expected[5], expected[2] = k[0], k[2]
    torch.testing.assert_close(k_flat, expected, atol=0, rtol=0)


def test_tiles_cover_every_query_token_once():
    assert cut_tiles([1, 5, 1], 2) == ([0, 1, 1, 1, 2], [0, 0, 2, 4, 0])


def test_triton_is_a_capability_not_a_crash_on_cpu():
    status = triton_status(torch.device("cpu"))
    assert not status.available
    assert "needs a CUDA device" in status.reason


def test_without_a_c_compiler_the_triton_kernel_is_unavailable_naming_what_it_needs(monkeypatch):
    """Triton builds a small C launcher at a kernel's first launch: a CUDA worker with no C
    compiler reports the backend unavailable, with the reason, instead of failing its first step
    (`auto` then falls back, saying why; `on` with `backend: triton` is refused by name)."""
    import shutil

    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    status = triton_status(torch.device("cuda"))  # a device object needs no GPU
    assert not status.available
    assert "C compiler" in status.reason and "CC" in status.reason and "gcc" in status.reason
