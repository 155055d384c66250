"""`intentserve up deploy/native.yaml` and `deploy/gemma-native.yaml` end to end: SmolLM2 and
Gemma 3 on one CPU worker each, held as their GGUF file's own blocks (`spec.model.weights:
native`), serving the greedy tokens of the engine run directly with the same weights, and
`status` reporting the tensors held per type and their resident bytes (the file's, within 10%).

A smaller KV budget and model length than the file's keep it light (env overrides).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest
import torch
from intentserve.client import ControllerClient
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model.gguf_loader import open_gguf
from intentserve.worker.model.registry import SHORT_NAMES, resolve_model_path

from tests.launcher.up_process import INTENTSERVE, UpProcess

pytestmark = pytest.mark.integration

MAX_MODEL_LEN = 256
KV_MEMORY_BYTES = 16 << 20
PROMPT = "The capital of France is"
NUM_TOKENS = 8
# manifest, model, what `status` says the worker holds, the threads its numCpus gives
SERVED = {
    "smollm2": (
        "deploy/native.yaml",
        "smollm2-135m",
        "tensors held as in the file: 210 Q4_1, 1 Q8_0; dequantized: none",
        1,
    ),
    "gemma3": (
        "deploy/gemma-native.yaml",
        "gemma3-270m",
        "tensors held as in the file: 27 Q4_K, 81 Q5_0, 9 Q6_K, 10 Q8_0; dequantized: none",
        2,
    ),
}


@pytest.fixture(scope="module", params=sorted(SERVED))
def served(request, tmp_path_factory):
    """The deployment (started first, so its worker loads while the reference is computed) and
    the reference: the greedy output of the engine run directly, configured as the worker is."""
    manifest, model, held, num_cpus = SERVED[request.param]
    if importlib.util.find_spec(SHORT_NAMES[model].module) is None:
        pytest.skip(f"{model}'s package {SHORT_NAMES[model].module} is not installed (make setup)")
    up = UpProcess(
        manifest,
        tmp_path_factory.mktemp("up-native"),
        INTENTSERVE_SPEC__PAGEDATTENTION__KVCACHEMEMORY=str(KV_MEMORY_BYTES),
        INTENTSERVE_SPEC__SCHEDULER__MAXMODELLEN=str(MAX_MODEL_LEN),
    )
    try:
        engine = (
            EngineBuilder()
            .model(model)
            .weights("native")
            .paged_attention("on", block_size=16)
            .kv_cache_memory(bytes=KV_MEMORY_BYTES)
            .scheduler(max_model_len=MAX_MODEL_LEN, max_num_seqs=16)
            .build()
        )
        threads = torch.get_num_threads()
        torch.set_num_threads(num_cpus)  # the manifest's numCpus: the worker's torch threads
        try:
            params = SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)
            out = engine.generate([PROMPT], params)[0]
        finally:
            torch.set_num_threads(threads)
        del engine
        up.wait_ready(timeout_s=300)
        yield up, (out.new_token_ids, out.new_text), model, held
    finally:
        up.stop()


def _status(up: UpProcess, *args: str) -> str:
    return subprocess.run(
        [str(INTENTSERVE), "status", *args, "--controller", up.address],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout


def test_the_native_worker_serves_the_engines_greedy_tokens(served):
    up, reference, _, _ = served
    with ControllerClient(up.address) as client:
        chunks = list(client.generate(PROMPT, max_tokens=NUM_TOKENS, ignore_eos=True))
    token_ids = tuple(t for c in chunks for t in c["token_ids"])
    assert (token_ids, "".join(c["text"] for c in chunks)) == reference


def test_status_reports_the_tensors_held_and_their_bytes(served):
    up, _, model, held = served
    (worker,) = json.loads(_status(up, "--json"))["workers"]
    realized = worker["realized"]
    assert (realized["weight_format"], realized["weights_held"]) == ("native", held)
    f = open_gguf(resolve_model_path(model))
    file_bytes = sum(int(f.stored(name).data.nbytes) for name in f.tensor_names)
    assert abs(int(realized["weight_bytes"]) - file_bytes) <= 0.1 * file_bytes
    assert held in _status(up)
