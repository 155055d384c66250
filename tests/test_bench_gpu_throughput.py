"""bench/gpu_throughput.py's arithmetic: the K/V a decode step reads from the engine's geometry,
the one-stream HBM limit, the share of the matmul ceiling, and which steps are timed (against a
stand-in engine: the figures are the lease's to measure)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from intentserve.worker.cache.kv_pool import KvGeometry

from bench.gpu_throughput import hbm_limit_s, matmul_share, step_kv_bytes, timed_decode

LLAMA_1B_BF16 = KvGeometry(num_layers=16, num_kv_heads=8, head_dim=64, dtype=torch.bfloat16)


def test_a_step_reads_layers_x_kv_heads_x_head_dim_x_k_and_v_x_dtype_bytes_a_context_token():
    assert LLAMA_1B_BF16.bytes_per_token == 16 * 8 * 64 * 2 * 2 == 32768
    assert step_kv_bytes(LLAMA_1B_BF16, 200) == 200 * 32768
    fp32 = KvGeometry(num_layers=30, num_kv_heads=3, head_dim=64, dtype=torch.float32)
    assert step_kv_bytes(fp32, 10) == 30 * 3 * 64 * 2 * 4 * 10


def test_the_one_stream_limit_is_weights_plus_kv_at_the_copy_bandwidth():
    kv = step_kv_bytes(LLAMA_1B_BF16, 200)  # 6,553,600 bytes
    limit = hbm_limit_s(2_471_000_000, kv, bandwidth_bytes_s=3.0e12)
    assert limit == pytest.approx((2_471_000_000 + 6_553_600) / 3.0e12)
    assert limit == pytest.approx(825.85e-6, rel=1e-4)


def test_the_matmul_share_counts_two_flops_a_parameter_a_token():
    # 1.2e9 bf16 parameters at 100,000 tokens/s: 2.4e14 flop/s of a 8e14 ceiling.
    share = matmul_share(2_400_000_000, 2, tokens_per_s=100_000, flops_s=8.0e14)
    assert share == pytest.approx(0.3)


@dataclass
class _Out:
    request_id: str
    new_token_ids: tuple[int, ...]
    num_prompt_tokens: int
    num_output_tokens: int


@dataclass
class _Engine:
    """Two prompts of 5 tokens: the first step prefills one, the second prefills the other
    and decodes the first; then both decode to 3 tokens."""

    made: dict[str, int] = field(default_factory=dict)
    script: list[list[str]] = field(
        default_factory=lambda: [["r0"], ["r0", "r1"], ["r0", "r1"], ["r1"]]
    )

    def add_request(self, prompt, params) -> str:
        request_id = f"r{len(self.made)}"
        self.made[request_id] = 0
        return request_id

    def step(self) -> list[_Out]:
        outs = []
        for request_id in self.script.pop(0):
            self.made[request_id] += 1
            outs.append(_Out(request_id, (7,), 5, self.made[request_id]))
        return outs

    @property
    def has_unfinished(self) -> bool:
        return bool(self.script)


def test_only_the_steps_after_the_last_prefill_are_timed_with_the_contexts_they_read():
    run = timed_decode(_Engine(), [[1] * 5, [1] * 5], new_tokens=3, device="cpu")
    # Timed: step 3 (r0's 3rd token, r1's 2nd) and step 4 (r1's 3rd).
    assert (run.steps, run.tokens) == (2, 3)
    assert run.context_tokens == (5 + 2) + (5 + 1) + (5 + 2)
