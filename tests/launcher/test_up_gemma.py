"""`intentserve up deploy/gemma.yaml` end to end: Gemma 3 270M on one CPU worker with paged
attention required, a prompt longer than its 512-token window served with the greedy tokens of
the engine run directly, and `up`, `status` and `explain` saying how the window is realized.

float32 and a smaller KV budget than the file's (env overrides), so the reference is exact.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from intentserve.client import ControllerClient
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams

from tests.launcher.up_process import INTENTSERVE, UpProcess

pytestmark = pytest.mark.integration

MAX_MODEL_LEN = 1024
KV_MEMORY_BYTES = 64 << 20
NUM_TOKENS = 6
NUM_THREADS = 2  # the manifest's numCpus: the worker's torch threads
# About 650 tokens: its last tokens' local layers no longer see the start.
PROMPT = (
    " ".join(f"Station {i} is {i * 3 % 17} kilometres north of the river." for i in range(48))
    + " The station furthest north is"
)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The deployment (started first, so its worker loads while the reference is computed) and
    the reference: the greedy output of the engine run directly, configured as the worker is."""
    up = UpProcess(
        "deploy/gemma.yaml",
        tmp_path_factory.mktemp("up-gemma"),
        INTENTSERVE_SPEC__MODEL__DTYPE="float32",
        INTENTSERVE_SPEC__PAGEDATTENTION__KVCACHEMEMORY=str(KV_MEMORY_BYTES),
        INTENTSERVE_SPEC__SCHEDULER__MAXMODELLEN=str(MAX_MODEL_LEN),
    )
    try:
        engine = (
            EngineBuilder()
            .model("gemma3-270m")
            .dtype("float32")
            .paged_attention("on", block_size=16)
            .kv_cache_memory(bytes=KV_MEMORY_BYTES)
            .scheduler(max_model_len=MAX_MODEL_LEN, max_num_seqs=16)
            .build()
        )
        threads = torch.get_num_threads()
        torch.set_num_threads(NUM_THREADS)
        try:
            params = SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)
            out = engine.generate([PROMPT], params)[0]
        finally:
            torch.set_num_threads(threads)
        num_prompt_tokens = len(engine.tokenizer.encode(PROMPT))
        del engine
        up.wait_ready(timeout_s=600)
        yield up, (out.new_token_ids, out.new_text), num_prompt_tokens
    finally:
        up.stop()


def _cli(up: UpProcess, *args: str) -> str:
    return subprocess.run(
        [str(INTENTSERVE), *args, "--controller", up.address],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout


def test_a_prompt_past_the_window_is_served_with_the_engines_greedy_tokens(served):
    up, reference, num_prompt_tokens = served
    assert num_prompt_tokens > 512 + 64
    with ControllerClient(up.address) as client:
        chunks = list(
            client.generate(PROMPT, max_tokens=NUM_TOKENS, ignore_eos=True, timeout_s=300)
        )
    token_ids = tuple(t for c in chunks for t in c["token_ids"])
    assert (token_ids, "".join(c["text"] for c in chunks)) == reference


def test_status_and_explain_say_how_the_window_is_realized(served):
    up, _, _ = served
    (worker,) = json.loads(_cli(up, "status", "--json"))["workers"]
    realized = worker["realized"]
    assert (realized["cache_kind"], realized["backend"]) == ("paged", "torch_paged")
    assert (realized["sliding_window"], realized["num_windowed_layers"]) == (512, 15)
    assert "sliding window 512 tokens on 15 layers (masked)" in up.stdout  # `up` progress
    explained = _cli(up, "explain", worker["worker_id"])
    assert "sliding window 512 tokens on 15 layers, masked in attention" in explained
