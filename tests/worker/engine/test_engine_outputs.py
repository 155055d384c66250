"""A request's greedy output depends on nothing but its prompt: not the cache kind, not its batch
mates, not arrival times, preemption or prefix-cache hits. Real model (SmolLM2), float32."""

import pytest
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams

pytestmark = pytest.mark.model

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4,",
]
GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)
MIB = 1 << 20


def engine(loaded, mode="on", *, kv_bytes=24 * MIB, max_model_len=256, **options):
    return (
        EngineBuilder()
        .paged_attention(mode, **options)
        .kv_cache_memory(bytes=kv_bytes)
        .scheduler(max_model_len=max_model_len, max_num_seqs=16)
        .build(loaded=loaded)
    )


def tokens(outputs):
    return [o.new_token_ids for o in outputs]


@pytest.fixture(scope="module")
def reference(smollm2_fp32):
    """Each prompt alone on the paged engine."""
    eng = engine(smollm2_fp32)
    return [tokens(eng.generate([p], GREEDY))[0] for p in PROMPTS]


def test_paged_batch_equals_each_prompt_alone(smollm2_fp32, reference):
    assert tokens(engine(smollm2_fp32).generate(PROMPTS, GREEDY)) == reference


def test_contiguous_cache_gives_identical_greedy_outputs(smollm2_fp32, reference):
    eng = engine(smollm2_fp32, "off")
    assert eng.realized.cache.kind.value == "contiguous"
    assert tokens(eng.generate(PROMPTS, GREEDY)) == reference


def test_staggered_arrivals_do_not_change_outputs(smollm2_fp32, reference):
    eng = engine(smollm2_fp32)
    got: dict[str, list[int]] = {}
    ids = {}
    for i, prompt in enumerate(PROMPTS):
        ids[eng.add_request(prompt, GREEDY)] = i
        for _ in range(3 * i + 1):  # the others join mid-decode of the earlier ones
            for out in eng.step():
                got.setdefault(out.request_id, []).extend(out.new_token_ids)
    for out in eng.stream():
        got.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert [tuple(got[r]) for r in sorted(ids, key=ids.get)] == reference


def test_preemption_by_recompute_does_not_change_outputs(smollm2_fp32, reference):
    # 4 blocks hold one 64-token sequence; four ~25-token sequences need 8 of the 5: preemption.
    block_bytes = 16 * 2 * 30 * 3 * 64 * 4
    eng = engine(smollm2_fp32, kv_bytes=5 * block_bytes, max_model_len=64, prefix_caching="off")
    assert eng.realized.cache.num_blocks == 5
    assert tokens(eng.generate(PROMPTS, GREEDY)) == reference
    assert eng.scheduler.stats().num_preemptions > 0
    assert eng.scheduler.stats().kv.num_used_blocks == 0


def test_prefix_cache_hits_do_not_change_outputs(smollm2_fp32):
    shared = "You are a helpful assistant. Answer briefly and precisely. " * 3
    prompts = [shared + "What is two plus two?", shared + "Name a color."]
    cold = engine(smollm2_fp32, prefix_caching="off")
    expected = [tokens(cold.generate([p], GREEDY))[0] for p in prompts]
    warm = engine(smollm2_fp32, prefix_caching="on")
    first = tokens(warm.generate([prompts[0]], GREEDY))
    second = tokens(warm.generate([prompts[1]], GREEDY))
    assert first + second == expected
    assert warm.scheduler.stats().kv.num_prefix_hit_tokens >= 32  # at least two shared blocks


def test_abort_frees_every_block(smollm2_fp32):
    eng = engine(smollm2_fp32)
    kept = eng.add_request(PROMPTS[0], GREEDY)
    dropped = eng.add_request(PROMPTS[2], SamplingParams(max_tokens=200))
    eng.step()
    eng.step()
    assert eng.abort(dropped)
    assert not eng.abort(dropped)  # already gone
    finished = [o for o in eng.stream() if o.finished]
    assert [o.request_id for o in finished] == [kept]
    assert eng.scheduler.stats().kv.num_used_blocks == 0


def test_stop_strings_token_ids_and_eos(smollm2_fp32, reference):
    eng = engine(smollm2_fp32)
    full = eng.tokenizer.decode(reference[1])
    stop = full.strip().split()[2]  # a word the greedy continuation really produces
    (out,) = eng.generate([PROMPTS[1]], SamplingParams(max_tokens=16, stop=(stop,)))
    assert out.finish_reason.value == "stop"
    assert stop not in out.new_text and full.startswith(out.new_text)
    assert out.stop_string == stop  # which of the stop strings ended it
    (out,) = eng.generate(
        [PROMPTS[1]], SamplingParams(max_tokens=16, stop_token_ids=(reference[1][3],))
    )
    assert out.new_token_ids == reference[1][:4] and out.finish_reason.value == "stop"
    assert out.stop_string == ""


def test_seeded_sampling_is_reproducible_and_batch_independent(smollm2_fp32):
    params = SamplingParams(
        max_tokens=16, temperature=0.8, top_p=0.9, top_k=50, seed=7, ignore_eos=True
    )
    eng = engine(smollm2_fp32)
    alone = tokens(eng.generate([PROMPTS[2]], params))
    crowded = tokens(eng.generate([PROMPTS[0], PROMPTS[2], PROMPTS[3]], params))
    assert crowded[1] == alone[0]
    other_seed = SamplingParams(max_tokens=16, temperature=0.8, seed=8, ignore_eos=True)
    assert tokens(eng.generate([PROMPTS[2]], other_seed)) != alone


def test_the_torch_gather_decode_path_gives_identical_greedy_outputs(smollm2_fp32, reference):
    """The engine without the compiled CPU decode kernel (no compiler, or turned off) decodes
    the same tokens; with a compiler the reference above ran through the kernel."""
    eng = engine(smollm2_fp32)
    eng.runner.attention.kernel = None  # what TorchPagedAttention does when the build fails
    assert tokens(eng.generate(PROMPTS, GREEDY)) == reference
