"""The GPU check's flex_vs_triton part: decode attention at the 1B shape, the project's Triton
paged kernel beside torch's FlexAttention, so that `auto`'s order comes from a measurement.

A case is one layer's attention in one decode step: B sequences of one new token, 32 query heads
over 8 KV heads of 64, bf16, contexts spread over (L/2, L], held in 16-token blocks scattered
over the pool as an engine's are after a while.
- triton: `TritonPagedAttention.attend`, K and V read in place through the block table;
- flex: `torch.nn.attention.flex_attention` over each sequence's blocks gathered into
  [B, Hkv, W * 16, D], a block mask of each one's context, grouped-query heads by `enable_gqa`;
  the gather and the attention compiled together by `torch.compile` on CUDA, eager on a CPU.
  The gather is part of its time (what a backend over this pool would pay that way); the eager
  gather alone is timed beside it.
Both are checked first against float64 attention (tests/worker/engine/reference.py) on a few
sequences of the case, then timed: on CUDA `triton.testing.do_bench`'s median (the L2 cleared
before each run, so K/V come from HBM as in a step), on a CPU a mean of a few runs (the dry run:
figures mean nothing there).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from bench.gpu_parts import PartFailed, free_memory

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 64, 16
CASES = {
    "cuda": [(b, ctx) for b in (1, 64, 256) for ctx in (256, 1024, 4096)],
    "cpu": [(1, 80), (3, 40)],
}
ATOL = 3e-2  # bf16 inputs and output against float64
PART_BUDGET_S = {"cuda": 120.0, "cpu": 120.0}  # later cases are recorded as skipped
CPU_REPS = 3


@dataclass(frozen=True)
class Case:
    q: Tensor  # [B, H, D] bf16
    k_pool: Tensor  # [num_blocks, BLOCK_SIZE, Hkv, D]
    v_pool: Tensor
    tables: Tensor  # [B, W] int64, every block of the pool used once
    context_lens: list[int]
    triton: object  # TritonPagedAttention over the pool
    meta: object  # its TritonMetadata for this decode step


def make_case(batch: int, context: int, device: str, seed: int = 0) -> Case:
    from intentserve.policy import CacheKind
    from intentserve.worker.attention.batch import StepBatch
    from intentserve.worker.attention.triton_paged import TritonPagedAttention
    from intentserve.worker.cache.kv_pool import KvGeometry, KvPool

    width = -(-context // BLOCK_SIZE)
    num_blocks = batch * width
    geometry = KvGeometry(1, KV_HEADS, HEAD_DIM, torch.bfloat16)
    pool = KvPool(CacheKind.PAGED, geometry, num_blocks, BLOCK_SIZE, torch.device(device))
    on_device = torch.Generator(device=device).manual_seed(seed)
    pool.k[0].normal_(generator=on_device)
    pool.v[0].normal_(generator=on_device)
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=on_device, device=device)
    tables = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    tables = tables.reshape(batch, width)
    context_lens = [context - (i * 37) % (context // 2) for i in range(batch)]
    last = [  # each sequence's newest token's row
        int(table[(n - 1) // BLOCK_SIZE]) * BLOCK_SIZE + (n - 1) % BLOCK_SIZE
        for table, n in zip(tables, context_lens, strict=True)
    ]
    step = StepBatch(
        tables=tables.to(device),
        context_lens=context_lens,
        query_lens=[1] * batch,
        query_start=list(range(batch + 1)),
        slot_mapping=torch.tensor(last, device=device),
        positions=torch.tensor([n - 1 for n in context_lens], device=device),
        block_size=BLOCK_SIZE,
    )
    triton = TritonPagedAttention(pool, HEADS)
    return Case(
        q.to(torch.bfloat16),
        pool.k[0],
        pool.v[0],
        step.tables,
        context_lens,
        triton,
        triton.prepare(step),
    )


def triton_decode(case: Case) -> Tensor:  # [B, H, D]
    out = torch.empty_like(case.q)
    case.triton.attend(0, case.q, case.meta, out)
    return out


def gather_pages(k_pool: Tensor, v_pool: Tensor, tables: Tensor) -> tuple[Tensor, Tensor]:
    """Each sequence's blocks in order: [B, Hkv, W * BLOCK_SIZE, D] each."""
    k = k_pool[tables].flatten(1, 2).transpose(1, 2)
    v = v_pool[tables].flatten(1, 2).transpose(1, 2)
    return k, v


def flex_over_pages(q: Tensor, k_pool: Tensor, v_pool: Tensor, tables: Tensor, block_mask):
    """q: [B, H, 1, D] -> [B, H, 1, D]: flex_attention over the gathered pages."""
    from torch.nn.attention.flex_attention import flex_attention

    k, v = gather_pages(k_pool, v_pool, tables)
    return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)


def flex_decode(case: Case, device: str):
    """A function that runs the case through flex (compiled on CUDA), [B, H, D] out."""
    from torch.nn.attention.flex_attention import create_block_mask

    lens = torch.tensor(case.context_lens, device=device)

    def within_context(b, h, q_idx, kv_idx):
        return kv_idx < lens[b]

    batch, width = case.tables.shape
    mask = create_block_mask(within_context, batch, None, 1, width * BLOCK_SIZE, device=device)
    if device == "cuda":
        # NOTE: every case is a new shape and mask, so a fresh compile; reset first so that
        # dynamo's limit of recompiles per function is never reached.
        torch.compiler.reset()
        fn = torch.compile(flex_over_pages, dynamic=False)
    else:
        fn = flex_over_pages
    q = case.q.unsqueeze(2)  # [B, H, 1, D]
    return lambda: fn(q, case.k_pool, case.v_pool, case.tables, mask).squeeze(2)


def max_errors(case: Case, outs: dict[str, Tensor]) -> dict[str, float]:
    """Each output's largest difference from float64 attention, over a few of the sequences."""
    from tests.worker.engine.reference import float64_attention

    errors = dict.fromkeys(outs, 0.0)
    batch = case.q.shape[0]
    for s in sorted({0, batch // 2, batch - 1}):
        n = case.context_lens[s]
        blocks = case.tables[s, : -(-n // BLOCK_SIZE)]
        offsets = torch.arange(BLOCK_SIZE, device=blocks.device)
        rows = (blocks[:, None] * BLOCK_SIZE + offsets).flatten()[:n]
        flat = case.k_pool.shape[0] * BLOCK_SIZE
        k = case.k_pool.reshape(flat, KV_HEADS, HEAD_DIM)[rows].cpu()  # [n, Hkv, D]
        v = case.v_pool.reshape(flat, KV_HEADS, HEAD_DIM)[rows].cpu()
        expected = float64_attention(case.q[s : s + 1].cpu(), k, v)[0]  # [H, D]
        for name, out in outs.items():
            error = (out[s].cpu().double() - expected).abs().max().item()
            errors[name] = max(errors[name], error)
    return errors


def time_ms(fn, device: str) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, return_mode="median"))
    fn()
    start = time.perf_counter()
    for _ in range(CPU_REPS):
        fn()
    return 1000 * (time.perf_counter() - start) / CPU_REPS


def _one_case(batch: int, context: int, device: str, flex_error: str) -> dict:
    case = make_case(batch, context, device)
    row: dict = {"batch": batch, "context": context}
    outs = {"triton": triton_decode(case)}
    flex = None
    if not flex_error:
        try:
            flex = flex_decode(case, device)
            outs["flex"] = flex()
        except Exception as exc:  # noqa: BLE001 - flex not running here is a finding
            row["flex_error"] = f"{type(exc).__name__}: {exc}"[:500]
            flex = None
    row["max_error"] = max_errors(case, outs)
    row["triton_ms"] = time_ms(lambda: triton_decode(case), device)
    if flex is not None:
        row["flex_ms"] = time_ms(flex, device)
        row["gather_ms"] = time_ms(
            lambda: gather_pages(case.k_pool, case.v_pool, case.tables), device
        )
        row["flex_over_triton"] = row["flex_ms"] / row["triton_ms"]
    return row


def flex_vs_triton(device: str) -> dict:
    start = time.perf_counter()
    rows: list[dict] = []
    flex_error = ""  # once flex fails, the later cases do not try again
    for batch, context in CASES[device]:
        if time.perf_counter() - start > PART_BUDGET_S[device]:
            rows.append({"batch": batch, "context": context, "skipped": "the part's time spent"})
            continue
        rows.append(_one_case(batch, context, device, flex_error))
        free_memory(device)  # the case's pool
        flex_error = flex_error or rows[-1].get("flex_error", "")
    wrong = [
        f"{name} at batch {r['batch']}, context {r['context']}: off by {error:.3g}"
        for r in rows
        for name, error in r.get("max_error", {}).items()
        if error > ATOL
    ]
    ratios = [r["flex_over_triton"] for r in rows if "flex_over_triton" in r]
    found: dict = {"rows": rows, "atol": ATOL}
    if ratios:
        geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        found["flex_over_triton_geomean"] = geomean
        first = "flex_attention" if geomean < 1 else "triton_paged"
        found["auto_first"] = first if device == "cuda" else "not measured (dry run)"
    else:
        found["flex"] = f"did not run: {flex_error}"
    if wrong:
        raise PartFailed("; ".join(wrong), found)
    if device == "cuda" and not ratios:
        raise PartFailed(f"flex_attention did not run: {flex_error}", found)
    return found
