"""The GPU check's throughput part: decode tokens/s of the 1B shape in bf16 at 1, 64 and 256
streams, against two limits measured in the same run:

- one stream against HBM streaming: a decode step reads every weight once and each sequence's
  K and V (layers x kv_heads x head_dim x 2 x dtype bytes for each token of its context), so it
  takes at least (weight bytes + KV bytes) / the bandwidth of a large device-to-device copy;
- 256 streams against the bf16 matmul ceiling: 2 flops a parameter a token, against the rate of
  an 8192^3 bf16 product.

Only decode steps are timed: the clock starts once every stream has its first token (prefill
done). At one stream the graph-replayed step is timed against the eager one too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from intentserve.worker.cache.kv_pool import KvGeometry

from bench.gpu_parts import (
    available_paged_backends,
    build,
    checkpoint,
    free_memory,
    greedy,
    prompts,
)

STREAMS = {"cuda": (1, 64, 256), "cpu": (1, 4)}
PROMPT_TOKENS = {"cuda": 128, "cpu": 8}
NEW_TOKENS = {"cuda": 128, "cpu": 4}
DTYPE = "bfloat16"


def step_kv_bytes(geometry: KvGeometry, context_tokens: float) -> float:
    """K/V bytes a decode step reads: every layer's K and V rows of `context_tokens` tokens (the
    sum of the step's sequences' contexts)."""
    return geometry.bytes_per_token * context_tokens


def hbm_limit_s(weight_bytes: int, kv_bytes: float, bandwidth_bytes_s: float) -> float:
    """The shortest a decode step can be: its weights and K/V read once at HBM's pace."""
    return (weight_bytes + kv_bytes) / bandwidth_bytes_s


def matmul_share(
    weight_bytes: int, element_bytes: int, tokens_per_s: float, flops_s: float
) -> float:
    """The share of the matmul ceiling that 2 flops a parameter a token make."""
    return 2 * (weight_bytes / element_bytes) * tokens_per_s / flops_s


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure_ceilings(device: str) -> dict:
    """HBM bandwidth (a 1 GiB copy, bytes read and written) and the bf16 matmul ceiling."""
    if device != "cuda":
        return {"bandwidth_bytes_s": 0.0, "matmul_flops_s": 0.0}
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")

    def timed(fn, reps: int) -> float:
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / reps

    copy_s = timed(lambda: dst.copy_(src), 20)
    mm_s = timed(lambda: a @ a, 50)
    return {"bandwidth_bytes_s": 2 * n / copy_s, "matmul_flops_s": 2 * 8192**3 / mm_s}


@dataclass(frozen=True)
class DecodeRun:
    steps: int
    tokens: int
    seconds: float
    context_tokens: int  # summed over the timed steps and their sequences: what attention read


def timed_decode(engine, prompt_ids: list[list[int]], new_tokens: int, device: str) -> DecodeRun:
    """Every prompt to `new_tokens` tokens; the steps after the last prefill are timed."""
    from intentserve.worker.engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    waiting = {engine.add_request(p, params) for p in prompt_ids}
    while waiting:  # prefill (in chunks where it must be): not timed
        waiting -= {out.request_id for out in engine.step()}
    _sync(device)
    start = time.perf_counter()
    steps = tokens = context = 0
    while engine.has_unfinished:
        outs = engine.step()
        steps += 1
        for out in outs:
            tokens += len(out.new_token_ids)
            # The step that made token k read the prompt and the k - 1 tokens before it.
            context += out.num_prompt_tokens + out.num_output_tokens - 1
    _sync(device)
    return DecodeRun(steps, tokens, time.perf_counter() - start, context)


def _run(folder, device: str, backend: str, streams: int, cuda_graphs: bool = True):
    """(DecodeRun, weight bytes, KV geometry, decode graphs) of one engine at `streams`."""
    prompt_tokens = PROMPT_TOKENS[device]
    engine = build(
        folder,
        device,
        DTYPE,
        backend,
        max_num_seqs=streams,
        max_num_batched_tokens=max(8192, streams * prompt_tokens),
        cuda_graphs=cuda_graphs,
    )
    vocab = engine.runner.model.config.vocab_size
    greedy(engine, prompts(streams, vocab, prompt_tokens), 4)  # warm: Triton compiles
    run = timed_decode(engine, prompts(streams, vocab, prompt_tokens), NEW_TOKENS[device], device)
    cache = engine.realized.cache
    found = (run, cache.weight_bytes, engine.runner.attention.pool.geometry, cache.decode_graphs)
    del engine
    free_memory(device)
    return found


def throughput(device: str) -> dict:
    _, _, folder = checkpoint("llama-3.2-1b", device)
    ceilings = measure_ceilings(device)
    free_memory(device)  # its 2 GiB
    backend = available_paged_backends(device)[0]
    element_bytes = torch.empty((), dtype=getattr(torch, DTYPE)).element_size()
    rows, graphs = [], ""
    for streams in STREAMS[device]:
        run, weight_bytes, geometry, graphs = _run(folder, device, backend, streams)
        step_s = run.seconds / run.steps
        kv_bytes = step_kv_bytes(geometry, run.context_tokens / run.steps)
        row = {
            "streams": streams,
            "tokens_per_s": run.tokens / run.seconds,
            "step_ms": 1000 * step_s,
            "mean_context_tokens": run.context_tokens / max(1, run.tokens),
            "weight_bytes": weight_bytes,
            "kv_bytes_per_step": kv_bytes,
        }
        if streams == 1:
            eager = _run(folder, device, backend, 1, cuda_graphs=False)[0]
            row["eager_step_ms"] = 1000 * eager.seconds / eager.steps
            row["graph_speedup"] = row["eager_step_ms"] / row["step_ms"]
        if ceilings["bandwidth_bytes_s"]:
            limit_s = hbm_limit_s(weight_bytes, kv_bytes, ceilings["bandwidth_bytes_s"])
            row["hbm_limit_ms"] = 1000 * limit_s
            row["x_hbm_limit"] = step_s / limit_s
            row["share_of_matmul_ceiling"] = matmul_share(
                weight_bytes, element_bytes, row["tokens_per_s"], ceilings["matmul_flops_s"]
            )
        rows.append(row)
    targets = {
        "one stream <= 2x HBM streaming of weights + KV": rows[0].get("x_hbm_limit", 0) <= 2,
        "256 streams >= 20% of the bf16 matmul ceiling": rows[-1].get("share_of_matmul_ceiling", 0)
        >= 0.2,
        "graph step >= 3x faster than eager at one stream": rows[0]["graph_speedup"] >= 3,
    }
    return {
        "backend": backend,
        "dtype": DTYPE,
        "ceilings": ceilings,
        "rows": rows,
        "decode_graphs": graphs or "none (eager steps)",
        "targets_met": targets if device == "cuda" else "not measured (dry run)",
    }
