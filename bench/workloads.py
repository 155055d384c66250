"""The measurements behind bench/engine.py, one function each."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model.gguf_loader import GGUFFile, gguf_hf_weights, gguf_model_config
from intentserve.worker.model.loaded import LoadedModel
from intentserve.worker.model.registry import load_model, resolve_model_path
from intentserve.worker.runtime.heap import settle_heap

# SmolLM2-135M: about 2 x 134.5 M multiply-adds per generated token.
FLOP_PER_TOKEN = 2 * 134.5e6
MODEL = "smollm2-135m"
# Issue 13's targets: one stream within 1.25x of the weight-streaming limit; batches (bf16) at
# these fractions of the in-run matmul roofline.
SINGLE_STREAM_TARGET = 1.25
ROOFLINE_TARGETS = {32: 0.55, 64: 0.65}
MAX_MODEL_LEN = 512
PROMPTS = [
    "The history of the printing press begins in",
    "Write a short poem about the sea and the wind at night.",
    "def quicksort(items):\n    # sort a list of integers",
    "In a distant galaxy, a small robot woke up and",
    "Explain why the sky is blue in simple terms for a child.",
    "The three most important inventions of the twentieth century are",
    "Once upon a time, in a small village by the mountains, there lived",
    "A recipe for a simple tomato soup: first,",
]


@dataclass
class Models:
    ours: LoadedModel
    hf: torch.nn.Module | None


def load_models(dtype: torch.dtype, with_hf: bool) -> Models:
    ours = load_model(MODEL, dtype=str(dtype).removeprefix("torch."))
    hf = None
    if with_hf:
        from intentserve.worker.model.hf_reference import (
            hf_model,  # transformers: a bench/test dependency
        )

        gguf = GGUFFile(resolve_model_path(MODEL))
        config = gguf_model_config(gguf)
        hf = hf_model(config, gguf_hf_weights(gguf, config)).to(dtype)
    settle_heap()  # as a serving worker does once its engine is built
    return Models(ours, hf)


def matmul_flops(dtype: torch.dtype, size: int = 2048, seconds: float = 3.0) -> float:
    """The machine's dense matmul ceiling in FLOP/s for this dtype (all torch threads)."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    a @ b  # warm-up: thread pool, kernels
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * size**3 * count / (time.perf_counter() - start)


def int8_matmul_ops(size: int = 2048, seconds: float = 3.0) -> float:
    """The machine's int8 x int8 -> int32 matmul ceiling in OP/s (`torch._int_mm`: the int8
    dot-product instructions where the CPU has them), all torch threads."""
    a = torch.randint(-128, 128, (size, size), dtype=torch.int8)
    b = torch.randint(-128, 128, (size, size), dtype=torch.int8)
    torch._int_mm(a, b)  # warm-up
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch._int_mm(a, b)
        count += 1
    return 2 * size**3 * count / (time.perf_counter() - start)


@torch.inference_mode()
def projection_floor(models: Models, num_rows: int, repeats: int = 7) -> float:
    """Seconds per decode step that the model's own projections and LM head take for `num_rows`
    sequences, with nothing else (no attention, norms, sampling or Python scheduling): the
    floor under any engine built on these weights and matmul kernels. Call it after an engine
    was built, so the projections are the ones the engine runs (packed, on the CPU)."""
    model = models.ours.model
    dtype = models.ours.dtype
    c = model.config
    inputs = {
        width: torch.randn(num_rows, width, dtype=dtype)
        for width in (c.hidden_size, c.num_heads * c.head_dim, c.intermediate_size)
    }
    hidden, heads = inputs[c.hidden_size], inputs[c.num_heads * c.head_dim]
    inter = inputs[c.intermediate_size]

    def step() -> None:
        for layer in model.layers:
            layer.self_attn.qkv_proj(hidden)
            layer.self_attn.o_proj(heads)
            layer.mlp.gate_up_proj(hidden)
            layer.mlp.down_proj(inter)
        model.compute_logits(hidden)

    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def read_bandwidth(num_bytes: int = 2**30) -> float:
    """Bytes/s of one large read: torch's float32 sum over `num_bytes` (all torch threads)."""
    data = torch.ones(num_bytes // 4, dtype=torch.float32)
    data.sum()  # warm-up: pages touched, thread pool up
    start = time.perf_counter()
    data.sum()
    return num_bytes / (time.perf_counter() - start)


def _tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of the tensors a module holds: parameters, buffers and plain tensor attributes
    (a packed or quantized weight is often the last kind)."""
    found = [*module.parameters(), *module.buffers()]
    found += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
    unique = {id(t): t for t in found}
    return sum(t.numel() * t.element_size() for t in unique.values())


def weight_bytes_per_step(models: Models) -> int:
    """Bytes of weights a decode step reads, from the realized model: every projection and the
    LM head (for a tied head without its own copy, the embedding table it reads), not the
    embedding lookup. Call it after an engine was built (packed weights are what runs)."""
    model = models.ours.model
    total = 0
    for layer in model.layers:
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj):
            total += _tensor_bytes(linear)
        total += _tensor_bytes(layer.mlp.gate_up_proj) + _tensor_bytes(layer.mlp.down_proj)
    head = model.lm_head
    embed = model.embed_tokens.weight
    return total + (embed.numel() * embed.element_size() if head is None else _tensor_bytes(head))


def decode_read_bytes(models: Models, concurrency: int, max_tokens: int) -> int:
    """Bytes an average decode step of `engine_throughput`'s workload reads at the least: the
    weights (weight_bytes_per_step) and every sequence's K/V so far, at the mean context of its
    decode steps (its prompt's tokens + max_tokens / 2). Divided by the read bandwidth, the
    memory-bound floor of a step, whatever the arithmetic costs."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(concurrency)]
    tokens = sum(len(models.ours.tokenizer.encode(p)) for p in prompts)
    context = tokens + concurrency * max_tokens / 2
    return weight_bytes_per_step(models) + int(context * _bytes_per_token(models))


def single_stream(models: Models, rounds: int = 5, steps_per_round: int = 24) -> dict:
    """One sequence decoding: seconds per token (decode steps only) against the weight-streaming
    limit, bytes of weights per step / read bandwidth. The two are measured alternately, round
    by round, in this process, and each is the median over rounds (the machine may be shared).
    """
    kv_bytes = MAX_MODEL_LEN * _bytes_per_token(models)
    engine = _engine(models, "paged", 1, kv_bytes)
    engine.generate([PROMPTS[0]], SamplingParams(max_tokens=4))  # warm-up
    bandwidths, step_times = [], []
    for _ in range(rounds):
        bandwidths.append(read_bandwidth())
        engine.add_request(
            PROMPTS[1], SamplingParams(max_tokens=steps_per_round + 2, ignore_eos=True)
        )
        engine.step()  # the prefill
        times = []
        while engine.has_unfinished:
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
        step_times.append(sorted(times)[len(times) // 2])
    bandwidth = sorted(bandwidths)[rounds // 2]
    step_s = sorted(step_times)[rounds // 2]
    weight_bytes = weight_bytes_per_step(models)
    limit_s = weight_bytes / bandwidth
    return {
        "read_bandwidth_bytes_per_s": bandwidth,
        "weight_bytes_per_step": weight_bytes,
        "limit_ms": limit_s * 1e3,
        "ms_per_token": step_s * 1e3,
        "ratio_to_limit": step_s / limit_s,
        "target_ratio": SINGLE_STREAM_TARGET,
        "met": step_s / limit_s <= SINGLE_STREAM_TARGET,
    }


def _engine(models: Models, kind: str, max_num_seqs: int, kv_bytes: int, block_size: int = 16):
    """kind: "paged" (mode on, blocks of `block_size`) or "default" (mode off, contiguous)."""
    mode = "on" if kind == "paged" else "off"
    options = {"block_size": block_size} if kind == "paged" else {}
    return (
        EngineBuilder()
        .paged_attention(mode, prefix_caching="off", **options)
        .kv_cache_memory(bytes=kv_bytes)
        .scheduler(
            max_model_len=MAX_MODEL_LEN, max_num_seqs=max_num_seqs, max_num_batched_tokens=4096
        )
        .build(loaded=models.ours)
    )


def _bytes_per_token(models: Models) -> int:
    c = models.ours.config
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * models.ours.dtype.itemsize


def engine_throughput(models: Models, kind: str, concurrency: int, max_tokens: int) -> float:
    """Output tokens/s for `concurrency` requests submitted together, run to completion."""
    kv_bytes = concurrency * MAX_MODEL_LEN * _bytes_per_token(models)
    engine = _engine(models, kind, concurrency, kv_bytes)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    engine.generate([PROMPTS[0]], SamplingParams(max_tokens=4))  # warm-up
    start = time.perf_counter()
    outputs = engine.generate([PROMPTS[i % len(PROMPTS)] for i in range(concurrency)], params)
    elapsed = time.perf_counter() - start
    assert all(len(o.new_token_ids) == max_tokens for o in outputs)
    return concurrency * max_tokens / elapsed


@torch.inference_mode()
def hf_throughput(models: Models, concurrency: int, max_tokens: int) -> float:
    """transformers `generate`, batched and left-padded, greedy, EOS ignored."""
    tok = models.ours.tokenizer
    pad = tok.eos_token_ids[0]
    prompts = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(concurrency)]
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    generate = dict(do_sample=False, pad_token_id=pad, eos_token_id=None)
    models.hf.generate(
        input_ids[:1], attention_mask=attention_mask[:1], max_new_tokens=4, **generate
    )
    start = time.perf_counter()
    out = models.hf.generate(
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        **generate,
    )
    elapsed = time.perf_counter() - start
    assert out.shape[1] == width + max_tokens
    return concurrency * max_tokens / elapsed


def chat_prompt(i: int) -> str:
    """A chat-sized prompt (46 to 125 tokens): several of the short prompts in a row."""
    return " ".join(PROMPTS[(i + j) % len(PROMPTS)] for j in range(4 + i % 8))


def kv_waste(models: Models, num_requests: int = 32, longest: int = 256) -> dict:
    """KV reserved versus held by live tokens, summed over every step of a workload with
    chat-sized prompts and mixed output lengths (16..`longest` tokens), for both caches under the
    same budget. Waste is reserved-but-empty token slots over reserved token slots."""
    kv_bytes = num_requests * MAX_MODEL_LEN * _bytes_per_token(models)
    report = {}
    # The default block size, a finer one (half the tail per sequence), and the contiguous slots.
    for name, kind, block_size in (
        ("paged", "paged", 16),
        ("paged_block_8", "paged", 8),
        ("default", "default", 16),
    ):
        engine = _engine(models, kind, num_requests, kv_bytes, block_size)
        for i in range(num_requests):
            length = 16 + ((longest - 16) * i) // (num_requests - 1)
            engine.add_request(chat_prompt(i), SamplingParams(max_tokens=length, ignore_eos=True))
        reserved = live = 0
        while engine.has_unfinished:
            engine.step()
            kv = engine.scheduler.stats().kv
            reserved += kv.num_reserved_tokens
            live += kv.num_live_tokens
        report[name] = {
            "block_size": kv.block_size,
            "pool_tokens": kv.num_blocks * kv.block_size,
            "waste_of_reserved": 1 - live / reserved,
        }
    return report


def admission(models: Models, budget_seqs_at_max_len: int = 4, num_requests: int = 256) -> dict:
    """Concurrent sequences each cache admits under one KV budget (room for a few max-length
    sequences) when prompts are far shorter than max_model_len."""
    kv_bytes = budget_seqs_at_max_len * MAX_MODEL_LEN * _bytes_per_token(models)
    report = {"kv_budget_bytes": kv_bytes, "max_model_len": MAX_MODEL_LEN}
    for kind in ("paged", "default"):
        engine = _engine(models, kind, num_requests, kv_bytes)
        for i in range(num_requests):
            engine.add_request(
                PROMPTS[i % len(PROMPTS)], SamplingParams(max_tokens=8, ignore_eos=True)
            )
        peak = 0
        while engine.has_unfinished:
            engine.step()
            peak = max(peak, engine.scheduler.stats().num_running)
        report[kind] = peak
    report["ratio"] = report["paged"] / report["default"]
    return report
