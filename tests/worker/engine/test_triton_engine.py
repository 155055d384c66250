"""The engine over the triton_paged backend, as a CUDA worker builds it, run on a CPU: the worker's
capability is described as a CUDA build's (the backend listed available) and the kernels run under
Triton's interpreter (tests/conftest.py). Chunked prefill, prefix caching, banded layers: the
greedy tokens are those of cache-free attention over the whole sequence, and the realized report
names the backend and its kernel."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from intentserve.policy import BackendKind, BackendStatus, resolve
from intentserve.worker.attention.triton_paged import TRITON_KV_DTYPES
from intentserve.worker.capability import probe_backends, probe_capability
from intentserve.worker.engine.builder import EngineBuilder, build_engine
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model.facts import model_facts
from intentserve.worker.model.reference_attention import reference_logits
from intentserve.worker.model.registry import load_model

from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_gguf

pytest.importorskip("triton", reason="triton is not installed (it is in the project's test extra)")

# On a CUDA host the kernels compile and the engine runs on the device (the `gpu` layer).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)
PROMPTS = [
    [int(i) for i in torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(n))]
    for n in (23, 12, 3)
]


def _tiny(tmp_path_factory, architecture):
    config = tiny_config(architecture)
    path = write_gguf(
        tmp_path_factory.mktemp(architecture) / "tiny.gguf", config, random_hf_weights(config)
    )
    return load_model(str(path), dtype="float32", device=DEVICE)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory):
    return _tiny(tmp_path_factory, request.param)


def _cuda_like_capability(loaded, max_model_len):
    """This CPU's capability with the Triton backend listed as a CUDA worker lists it (a CUDA
    host's own, as probed)."""
    facts = model_facts(loaded.config, max_model_len)
    if DEVICE == "cuda":
        return probe_capability(DEVICE, facts)
    backends = tuple(
        BackendStatus(BackendKind.TRITON_PAGED, True, "", TRITON_KV_DTYPES)
        if b.kind is BackendKind.TRITON_PAGED
        else b
        for b in probe_backends(torch.device("cpu"))
    )
    return probe_capability("cpu", facts, backends=backends)


def _triton_engine(loaded, **paged_options):
    builder = (
        EngineBuilder()
        .device(DEVICE)
        .paged_attention("on", backend="triton", block_size=4, **paged_options)
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=8)  # chunked
    )
    config = builder.config
    capability = _cuda_like_capability(loaded, 64)
    resolution = resolve(config.paged, capability, config.auto_enabled_devices, config.weights)
    return build_engine(config, loaded=loaded, capability=capability, resolution=resolution)


def _reference_greedy(loaded, ids: list[int]) -> list[int]:
    out: list[int] = []
    for _ in range(GREEDY.max_tokens):
        out.append(int(reference_logits(loaded.model, ids + out)[-1].argmax()))
    return out


def test_greedy_tokens_match_cache_free_attention(tiny):
    engine = _triton_engine(tiny, prefix_caching="on")
    report = engine.realized
    assert report.cache.backend is BackendKind.TRITON_PAGED
    how = "Triton interpreter" if DEVICE == "cpu" else "Triton "
    assert f"paged_attention kernel ({how}" in report.cache.attention_kernel
    expected = [_reference_greedy(tiny, p) for p in PROMPTS]
    outputs = engine.generate(PROMPTS, GREEDY)
    assert [list(o.new_token_ids) for o in outputs] == expected
    # The same prompts again: their blocks now come from the prefix cache.
    again = engine.generate(PROMPTS, GREEDY)
    assert [list(o.new_token_ids) for o in again] == expected
    assert engine.scheduler.stats().kv.num_prefix_hit_tokens >= 20  # a's 5 whole blocks, b's 2


def test_an_fp8_cache_is_realized_and_reported(tmp_path_factory):
    loaded = _tiny(tmp_path_factory, "llama")
    engine = _triton_engine(loaded, kv_cache_dtype="fp8_e4m3")
    assert engine.realized.cache.kv_cache_dtype == "float8_e4m3fn"
    out = engine.generate(PROMPTS[:1], GREEDY)[0]
    assert len(out.new_token_ids) == GREEDY.max_tokens


@pytest.mark.skipif(DEVICE == "cuda", reason="a CUDA host runs the Triton kernel")
def test_triton_is_refused_by_name_where_the_worker_cannot_run_it(tmp_path_factory):
    """This CPU's own capability: `backend: triton` is a requirement, refused with the reason."""
    loaded = _tiny(tmp_path_factory, "llama")
    builder = EngineBuilder().paged_attention("on", backend="triton").kv_cache_memory(bytes=1 << 20)
    config = dataclasses.replace(builder.config, max_model_len=64)
    with pytest.raises(Exception, match="triton_paged.*needs a CUDA device"):
        build_engine(config, loaded=loaded)


def test_decode_steps_replayed_from_graphs_give_the_eager_tokens(tmp_path_factory):
    """The static buffers, padding rows and tiles a CUDA graph replays, with the graph replaced by
    one that re-runs the captured step (on a CPU there is nothing to capture): three sequences
    decode in the graph of four, one of them padding; prefill steps run eagerly."""
    from intentserve.worker.engine.cuda_graphs import DecodeGraphs, EagerStepGraph

    loaded = _tiny(tmp_path_factory, "llama")
    expected = [list(o.new_token_ids) for o in _triton_engine(loaded).generate(PROMPTS, GREEDY)]
    engine = _triton_engine(loaded)
    runner = engine.runner
    graphs = DecodeGraphs(
        runner.model, runner.attention, 4, 64 // 4, torch.device(DEVICE), EagerStepGraph
    ).capture([1, 4])
    replays = []
    graph_run = graphs.run

    def counting_run(batch, input_ids):
        hidden = graph_run(batch, input_ids)
        replays.append((batch.num_seqs, hidden is not None))
        return hidden

    graphs.run = counting_run
    runner.graphs = graphs
    assert graphs.describe().startswith("CUDA graphs for 2 batch sizes (1-4)")
    assert [list(o.new_token_ids) for o in engine.generate(PROMPTS, GREEDY)] == expected
    assert (3, True) in replays  # three decodes in the graph of four
    assert any(not replayed for _, replayed in replays)  # prefill steps ran eagerly
