"""The torch paged backend against dense causal attention, for steps that mix prefill chunks and
decodes; and the flash backend's plumbing, with a reference kernel injected in place of CUDA."""

import shutil

import pytest
import torch
from intentserve.policy import CacheKind
from intentserve.worker.attention import torch_paged
from intentserve.worker.attention.batch import build_step_batch
from intentserve.worker.attention.flash_paged import FlashPagedAttention, flash_status
from intentserve.worker.attention.torch_paged import TorchPagedAttention
from intentserve.worker.cache.kv_pool import KvGeometry, KvPool
from intentserve.worker.sched.scheduler_output import ScheduledSeq

from tests.worker.engine.reference import float64_attention

H, HKV, D, BS = 6, 2, 16, 4
torch.manual_seed(0)

# The compiled decode kernel needs a C compiler on the host; without one the backend gathers (and
# says why), which the "gather" variants below cover.
HAS_CC = any(shutil.which(name) for name in ("cc", "gcc", "clang"))
requires_cc = pytest.mark.skipif(
    not HAS_CC, reason="no C compiler (cc, gcc or clang) to build the CPU decode kernel"
)
KERNEL_OR_GATHER = pytest.mark.parametrize(
    "use_kernel", [pytest.param(True, marks=requires_cc), False], ids=["kernel", "gather"]
)


def dense(q, k, v, window=None):
    """q: [n, H, D] for the last n positions of a context whose k, v are [ctx, HKV, D]."""
    return float64_attention(q, k, v, window).to(q.dtype)


def run_step(backend, pool, scheduled, history, layer_idx=0):
    """Feed one step's new k/v (from `history`) through the backend; return outputs per seq."""
    return run_layers(backend, pool, scheduled, history, [layer_idx])[layer_idx]


def run_layers(backend, pool, scheduled, history, layers):
    """One step through several layers (the same q/k/v in each); {layer: {seq: output}}."""
    batch = build_step_batch(scheduled, pool.block_size, torch.device("cpu"))
    meta = backend.prepare(batch)
    qs, ks, vs = [], [], []
    for item in scheduled:
        q_all, k_all, v_all = history[item.seq_id]
        sl = slice(item.start_pos, item.num_context_tokens)
        qs.append(q_all[sl]), ks.append(k_all[sl]), vs.append(v_all[sl])
    q, k, v = torch.cat(qs), torch.cat(ks), torch.cat(vs)
    seq_ids = [s.seq_id for s in scheduled]
    return {
        layer: dict(
            zip(seq_ids, backend.forward(layer, q, k, v, meta).split(batch.query_lens), strict=True)
        )
        for layer in layers
    }


def make_history(length):
    return torch.randn(length, H, D), torch.randn(length, HKV, D), torch.randn(length, HKV, D)


@KERNEL_OR_GATHER
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize(
    "short_reads",
    [2048, 50, 0],  # every chunk kernel rows; some (rows out of batch order); none: all SDPA
    ids=["chunks-as-kernel-rows", "mixed", "chunks-by-sdpa"],
)
def test_mixed_prefill_chunks_and_decodes_match_dense_attention(
    window, use_kernel, short_reads, monkeypatch
):
    monkeypatch.setattr(torch_paged, "SHORT_PREFILL_READS", short_reads)
    pool = KvPool(
        CacheKind.PAGED, KvGeometry(1, HKV, D, torch.float32), 32, BS, torch.device("cpu")
    )
    backend = TorchPagedAttention(pool, layer_windows=[window] * len(pool.k), use_kernel=use_kernel)
    assert (backend.kernel is not None) == use_kernel, backend.decode_impl
    history = {"a": make_history(12), "b": make_history(9), "c": make_history(7)}
    tables = {"a": (5, 1, 7), "b": (0, 2, 9), "c": (3, 4)}  # deliberately scattered blocks

    def item(seq_id, start, end):
        return ScheduledSeq(
            seq_id, start, tuple(range(end - start)), True, block_table=tables[seq_id]
        )

    steps = [
        [item("a", 0, 10), item("b", 0, 3)],  # a full prefill and a first chunk
        [item("a", 10, 11), item("b", 3, 8), item("c", 0, 6)],  # decode, later chunk, prefill
        [item("a", 11, 12), item("b", 8, 9), item("c", 6, 7)],  # all decodes
    ]
    for step in steps:
        outs = run_step(backend, pool, step, history)
        for s in step:
            q, k, v = history[s.seq_id]
            expected = dense(
                q[s.start_pos : s.num_context_tokens],
                k[: s.num_context_tokens],
                v[: s.num_context_tokens],
                window,
            )
            torch.testing.assert_close(outs[s.seq_id], expected, atol=1e-5, rtol=1e-5)


# Gemma 3 style: banded (local) layers interleaved with global ones, bands shorter than prompts.
LAYER_WINDOWS = (5, None, 3)


def _windowed_steps(tables):
    def item(seq_id, start, end):
        return ScheduledSeq(
            seq_id, start, tuple(range(end - start)), True, block_table=tables[seq_id]
        )

    return [
        [item("a", 0, 10), item("b", 0, 3)],  # a prompt longer than both bands; a first chunk
        [item("a", 10, 11), item("b", 3, 8), item("c", 0, 6)],  # decode, later chunk, prefill
        [item("a", 11, 12), item("b", 8, 9), item("c", 6, 7)],  # all decodes
    ]


@KERNEL_OR_GATHER
def test_each_layer_attends_within_its_own_window(use_kernel):
    pool = KvPool(
        CacheKind.PAGED,
        KvGeometry(len(LAYER_WINDOWS), HKV, D, torch.float32),
        32,
        BS,
        torch.device("cpu"),
    )
    backend = TorchPagedAttention(pool, layer_windows=LAYER_WINDOWS, use_kernel=use_kernel)
    assert (backend.kernel is not None) == use_kernel, backend.decode_impl
    history = {"a": make_history(12), "b": make_history(9), "c": make_history(7)}
    tables = {"a": (5, 1, 7), "b": (0, 2, 9), "c": (3, 4)}
    layers = range(len(LAYER_WINDOWS))
    for step in _windowed_steps(tables):
        outs = run_layers(backend, pool, step, history, layers)
        for layer, window in enumerate(LAYER_WINDOWS):
            for s in step:
                q, k, v = history[s.seq_id]
                n = s.num_context_tokens
                expected = dense(q[s.start_pos : n], k[:n], v[:n], window)
                torch.testing.assert_close(outs[layer][s.seq_id], expected, atol=1e-5, rtol=1e-5)


def test_flash_backend_passes_each_layer_its_window():
    geometry = KvGeometry(len(LAYER_WINDOWS), HKV, D, torch.float32)
    pools = [KvPool(CacheKind.PAGED, geometry, 32, BS, torch.device("cpu")) for _ in range(2)]
    torch_backend = TorchPagedAttention(pools[0], layer_windows=LAYER_WINDOWS)
    flash_backend = FlashPagedAttention(
        pools[1], kernel=reference_flash_kernel, layer_windows=LAYER_WINDOWS
    )
    history = {"a": make_history(12), "b": make_history(9), "c": make_history(7)}
    tables = {"a": (5, 1, 7), "b": (0, 2, 9), "c": (3, 4)}
    layers = range(len(LAYER_WINDOWS))
    for step in _windowed_steps(tables):
        a = run_layers(torch_backend, pools[0], step, history, layers)
        b = run_layers(flash_backend, pools[1], step, history, layers)
        for layer in layers:
            for seq_id in a[layer]:
                torch.testing.assert_close(a[layer][seq_id], b[layer][seq_id], atol=1e-5, rtol=1e-5)


def test_layer_windows_must_name_every_layer():
    pool = KvPool(CacheKind.PAGED, KvGeometry(2, HKV, D, torch.float32), 4, BS, torch.device("cpu"))
    with pytest.raises(ValueError, match="layer_windows has 3 entries for 2 layers"):
        TorchPagedAttention(pool, layer_windows=(4, None, 4))
    with pytest.raises(ValueError, match="layer_windows has 1 entries for 2 layers"):
        FlashPagedAttention(pool, kernel=reference_flash_kernel, layer_windows=(4,))


@KERNEL_OR_GATHER
def test_contiguous_addressing_is_one_block_per_slot(use_kernel):
    max_len = 16
    pool = KvPool(
        CacheKind.CONTIGUOUS, KvGeometry(1, HKV, D, torch.float32), 3, max_len, torch.device("cpu")
    )
    backend = TorchPagedAttention(pool, use_kernel=use_kernel)
    history = {"x": make_history(10), "y": make_history(5)}
    prefill = [
        ScheduledSeq("x", 0, tuple(range(9)), True, slot=2),
        ScheduledSeq("y", 0, tuple(range(4)), True, slot=0),
    ]
    decode = [
        ScheduledSeq("x", 9, (0,), True, slot=2),
        ScheduledSeq("y", 4, (0,), True, slot=0),
    ]
    run_step(backend, pool, prefill, history)
    outs = run_step(backend, pool, decode, history)
    for s in decode:
        q, k, v = history[s.seq_id]
        n = s.num_context_tokens
        torch.testing.assert_close(
            outs[s.seq_id], dense(q[n - 1 : n], k[:n], v[:n]), atol=1e-5, rtol=1e-5
        )
    # Slot 2 holds x's keys at rows 2 * max_len + position.
    torch.testing.assert_close(pool.k[0][2, :10], history["x"][1])


def reference_flash_kernel(
    q,
    k_cache,
    v_cache,
    *,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal,
    window_size,
    block_table,
):
    """What flash_attn_varlen_func computes with a block table, written plainly in torch."""
    assert causal and q.is_contiguous() and block_table.dtype == torch.int32
    block_size = k_cache.shape[1]
    outs = []
    for i in range(len(cu_seqlens_q) - 1):
        q_i = q[cu_seqlens_q[i] : cu_seqlens_q[i + 1]]
        ctx = int(cu_seqlens_k[i + 1] - cu_seqlens_k[i])
        pos = torch.arange(ctx)
        blocks = block_table[i].long()[pos // block_size]
        k_i = k_cache[blocks, pos % block_size]
        v_i = v_cache[blocks, pos % block_size]
        window = None if window_size == (-1, -1) else window_size[0] + 1
        outs.append(dense(q_i, k_i, v_i, window))
    return torch.cat(outs)


def test_flash_backend_plumbing_matches_torch_backend():
    geometry = KvGeometry(1, HKV, D, torch.float32)
    pools = [KvPool(CacheKind.PAGED, geometry, 16, BS, torch.device("cpu")) for _ in range(2)]
    torch_backend = TorchPagedAttention(pools[0])
    flash_backend = FlashPagedAttention(pools[1], kernel=reference_flash_kernel)
    history = {"a": make_history(9), "b": make_history(6)}
    steps = [
        [
            ScheduledSeq("a", 0, tuple(range(8)), True, block_table=(3, 0)),
            ScheduledSeq("b", 0, tuple(range(5)), True, block_table=(7, 5)),
        ],
        [
            ScheduledSeq("a", 8, (0,), True, block_table=(3, 0, 9)),
            ScheduledSeq("b", 5, (0,), True, block_table=(7, 5)),
        ],
    ]
    for step in steps:
        a = run_step(torch_backend, pools[0], step, history)
        b = run_step(flash_backend, pools[1], step, history)
        for seq_id in a:
            torch.testing.assert_close(a[seq_id], b[seq_id], atol=1e-5, rtol=1e-5)
    # Only the rows of written positions are compared: the rest of the pool is torch.empty.
    rows = [t[p // BS] * BS + p % BS for t, n in (((3, 0, 9), 9), ((7, 5), 6)) for p in range(n)]
    torch.testing.assert_close(pools[0].flat(0)[0][rows], pools[1].flat(0)[0][rows])
    torch.testing.assert_close(pools[1].flat(0)[0][rows[:9]], history["a"][1])


def test_flash_is_a_capability_not_a_crash_on_cpu():
    status = flash_status(torch.device("cpu"))
    assert not status.available
    assert "needs a CUDA device" in status.reason


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device; the plumbing is "
    "covered on CPU by test_flash_backend_plumbing_matches_torch_backend",
)
def test_flash_backend_on_cuda_matches_torch_backend():
    status = flash_status(torch.device("cuda"))
    if not status.available:
        pytest.skip(f"vllm-flash-attn unavailable on this CUDA host: {status.reason}")
    geometry = KvGeometry(1, HKV, D, torch.bfloat16)
    dev = torch.device("cuda")
    pools = [KvPool(CacheKind.PAGED, geometry, 64, 16, dev) for _ in range(2)]
    torch_backend, flash_backend = TorchPagedAttention(pools[0]), FlashPagedAttention(pools[1])
    step = [
        ScheduledSeq("a", 0, tuple(range(20)), True, block_table=(3, 1)),
        ScheduledSeq("b", 0, tuple(range(5)), True, block_table=(7,)),
    ]
    history = {
        k: tuple(t.to(dev, torch.bfloat16) for t in make_history(n))
        for k, n in (("a", 20), ("b", 5))
    }
    batch = build_step_batch(step, 16, dev)
    outs = []
    for backend in (torch_backend, flash_backend):
        meta = backend.prepare(batch)
        q = torch.cat([history[s.seq_id][0] for s in step])
        k = torch.cat([history[s.seq_id][1] for s in step])
        v = torch.cat([history[s.seq_id][2] for s in step])
        outs.append(backend.forward(0, q, k, v, meta).float())
    torch.testing.assert_close(outs[0], outs[1], atol=2e-2, rtol=2e-2)


def _decode_batch(num_seqs, dtype, use_kernel, window=None, head_dim=D):
    """num_seqs sequences of different lengths, all decoding one token, on scattered blocks."""
    gen = torch.Generator().manual_seed(num_seqs)
    num_blocks = 8 * num_seqs
    pool = KvPool(
        CacheKind.PAGED, KvGeometry(1, HKV, head_dim, dtype), num_blocks, BS, torch.device("cpu")
    )
    backend = TorchPagedAttention(pool, layer_windows=[window] * len(pool.k), use_kernel=use_kernel)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    scheduled, history = [], {}
    for i in range(num_seqs):
        ctx = 3 + (5 * i) % 27  # 3..29 tokens: partial and full blocks
        table = tuple(order[8 * i : 8 * i + -(-ctx // BS)])
        history[f"s{i}"] = tuple(
            torch.randn(ctx, h, head_dim, generator=gen).to(dtype) for h in (H, HKV, HKV)
        )
        scheduled.append((f"s{i}", ctx, table))
    # Prefill everything but the last token, then decode it: the decode reads the pool.
    prefill = [
        ScheduledSeq(s, 0, tuple(range(c - 1)), True, block_table=t) for s, c, t in scheduled
    ]
    decode = [ScheduledSeq(s, c - 1, (0,), True, block_table=t) for s, c, t in scheduled]
    run_step(backend, pool, prefill, history)
    return backend, run_step(backend, pool, decode, history), history, scheduled


@requires_cc
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("num_seqs", [3, 12])  # split by kv head below 8 sequences, whole above
def test_decode_kernel_matches_dense_attention_fp32(num_seqs, window):
    backend, outs, history, scheduled = _decode_batch(num_seqs, torch.float32, True, window)
    assert backend.kernel is not None, backend.decode_impl
    for seq_id, ctx, _ in scheduled:
        q, k, v = history[seq_id]
        expected = dense(q[ctx - 1 : ctx], k, v, window)
        torch.testing.assert_close(outs[seq_id], expected, atol=1e-5, rtol=1e-5)


@requires_cc
def test_decode_kernel_bf16_is_closer_to_fp32_than_the_gather_path():
    """bf16: the kernel keeps scores and probabilities in float32, the gather path rounds them to
    bf16 between its two matmuls; both must be within bf16 error of the float32 result."""
    _, kernel_outs, history, scheduled = _decode_batch(12, torch.bfloat16, True)
    _, gather_outs, _, _ = _decode_batch(12, torch.bfloat16, False)
    kernel_err = gather_err = 0.0
    for seq_id, ctx, _ in scheduled:
        q, k, v = (t.float() for t in history[seq_id])
        expected = dense(q[ctx - 1 : ctx], k, v)
        kernel_err = max(kernel_err, (kernel_outs[seq_id].float() - expected).abs().max().item())
        gather_err = max(gather_err, (gather_outs[seq_id].float() - expected).abs().max().item())
    assert kernel_outs["s0"].dtype == torch.bfloat16
    assert kernel_err < 2e-2 and gather_err < 5e-2
    assert kernel_err <= gather_err


@requires_cc
def test_decode_kernel_is_batch_invariant():
    """A sequence's decode output is bit-identical whether it runs alone or among 11 others."""
    _, together, history, scheduled = _decode_batch(12, torch.bfloat16, True)
    pool = KvPool(
        CacheKind.PAGED, KvGeometry(1, HKV, D, torch.bfloat16), 96, BS, torch.device("cpu")
    )
    backend = TorchPagedAttention(pool)
    seq_id, ctx, table = scheduled[5]
    run_step(
        backend,
        pool,
        [ScheduledSeq(seq_id, 0, tuple(range(ctx - 1)), True, block_table=table)],
        history,
    )
    alone = run_step(
        backend, pool, [ScheduledSeq(seq_id, ctx - 1, (0,), True, block_table=table)], history
    )
    assert torch.equal(alone[seq_id], together[seq_id])


def test_unsupported_head_dim_falls_back_to_the_gather_path_with_the_reason():
    backend, outs, history, scheduled = _decode_batch(3, torch.float32, True, head_dim=12)
    assert backend.kernel is None
    assert "head_dim a multiple of 16" in backend.decode_impl
    seq_id, ctx, _ = scheduled[0]
    q, k, v = history[seq_id]
    torch.testing.assert_close(outs[seq_id], dense(q[ctx - 1 : ctx], k, v), atol=1e-5, rtol=1e-5)


def test_step_batch_addresses_each_new_token_through_its_table():
    """Positions and flat cache rows of a step: a paged prefill chunk and a paged decode; then
    contiguous slots (a one-block table whose block is the whole slot, max_model_len long)."""
    step = [
        ScheduledSeq("p", 3, (5, 6, 7), True, block_table=(9, 2)),  # rows 3..5: blocks 9, 9, 2
        ScheduledSeq("d", 6, (8,), True, block_table=(4, 7)),  # row 6: block 7, offset 2
    ]
    batch = build_step_batch(step, BS, torch.device("cpu"))
    assert batch.positions.tolist() == [3, 4, 5, 6]
    assert batch.slot_mapping.tolist() == [9 * BS + 3, 2 * BS + 0, 2 * BS + 1, 7 * BS + 2]
    assert batch.tables.tolist() == [[9, 2], [4, 7]]
    assert batch.query_start == [0, 3, 4] and batch.context_lens == [6, 7]
    slots = [ScheduledSeq("a", 10, (1,), True, slot=3), ScheduledSeq("b", 0, (1, 2), True, slot=0)]
    batch = build_step_batch(slots, 32, torch.device("cpu"))
    assert batch.positions.tolist() == [10, 0, 1]
    assert batch.slot_mapping.tolist() == [3 * 32 + 10, 0, 1]


@requires_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [5, 24])  # serial; split over the threads (16 rows or more)
def test_the_compiled_kv_store_writes_what_index_copy_writes(dtype, rows):
    """The new rows come as strided views of the fused q|k|v projection, as the model sends."""

    def pool_and_backend():
        pool = KvPool(CacheKind.PAGED, KvGeometry(1, HKV, D, dtype), 32, BS, torch.device("cpu"))
        for cache in pool.flat(0):
            cache.zero_()  # allocated uninitialized: rows nobody writes must compare equal
        return pool, TorchPagedAttention(pool, use_kernel=True)

    qkv = torch.randn(rows, (H + 2 * HKV) * D).to(dtype)
    k = qkv[:, H * D : (H + HKV) * D].view(rows, HKV, D)
    v = qkv[:, (H + HKV) * D :].view(rows, HKV, D)
    slots = torch.randperm(32 * BS, generator=torch.Generator().manual_seed(rows))[:rows]
    pool, backend = pool_and_backend()
    k_cache, v_cache = pool.flat(0)
    assert backend._store_in_c(k, v, k_cache, v_cache, slots)
    expected_pool, _ = pool_and_backend()
    k_expected, v_expected = expected_pool.flat(0)
    k_expected.index_copy_(0, slots, k)
    v_expected.index_copy_(0, slots, v)
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)
    # A layout the kernel does not read (heads not adjacent) is left to index_copy_.
    assert not backend._store_in_c(k.transpose(1, 2), v.transpose(1, 2), k_cache, v_cache, slots)


@requires_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size",
    [
        (9, 3, 64, 16),  # SmolLM2: whole 16-token groups per block
        (4, 1, 256, 16),  # Gemma 3 270M: one kv head, the longest rows
        (14, 2, 64, 32),  # Qwen2-0.5B: 7 query heads a kv head (4 + 3), two groups a block
        (8, 8, 128, 8),  # no grouping; blocks shorter than a group of 16 tokens
    ],
)
def test_decode_kernel_geometries_match_float64_attention(
    heads, kv_heads, head_dim, block_size, dtype, kernel_variant
):
    """The compiled kernel called directly, on the head and block geometries of the models it
    serves, against attention in float64 on the same (rounded) values: contexts of 1 to 80 tokens
    on scattered blocks, so partial 16-token groups, block tails and more than four query heads a
    kv head all occur."""
    from intentserve.worker.kernels import paged_decode_kernel

    kernel = paged_decode_kernel()
    gen = torch.Generator().manual_seed(heads * head_dim + block_size)
    lens = [1, 7, 16, 17, 33, 80]
    width = -(-max(lens) // block_size)
    num_blocks = width * len(lens) + 3
    k_cache = torch.randn(num_blocks * block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks * block_size, kv_heads, head_dim, generator=gen).to(dtype)
    tables = torch.randperm(num_blocks, generator=gen)[: width * len(lens)].view(len(lens), width)
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(dtype)
    out = torch.empty_like(q)
    context = torch.tensor(lens, dtype=torch.int64)
    fn = kernel.bf16 if dtype == torch.bfloat16 else kernel.f32
    scale = head_dim**-0.5
    code = fn(
        q.data_ptr(), heads * head_dim, k_cache.data_ptr(), v_cache.data_ptr(),
        tables.contiguous().data_ptr(), width, context.data_ptr(), len(lens), heads, kv_heads,
        head_dim, block_size, 0, scale, out.data_ptr(),
    )  # fmt: skip
    assert code == 0
    group = heads // kv_heads
    for s, ctx in enumerate(lens):
        slots = [
            tables[s, p // block_size].item() * block_size + p % block_size for p in range(ctx)
        ]
        k = k_cache[slots].double().repeat_interleave(group, dim=1)  # [ctx, heads, head_dim]
        v = v_cache[slots].double().repeat_interleave(group, dim=1)
        weights = (torch.einsum("hd,khd->hk", q[s].double(), k) * scale).softmax(-1)
        expected = torch.einsum("hk,khd->hd", weights, v)
        tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
        torch.testing.assert_close(out[s].double(), expected, atol=tol, rtol=tol)
