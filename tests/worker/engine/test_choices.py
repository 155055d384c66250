"""n > 1 in the engine: the prompt is computed once and its KV blocks shared by fork, also with
prefix caching off; each choice is what the same request alone gives with its seed. Real model
(SmolLM2), float32."""

import dataclasses

import pytest
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams

pytestmark = pytest.mark.model

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 2 + (
    "Keep it sad."
)
SAMPLED = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=7, ignore_eos=True)


def engine(loaded, prefix_caching="off"):
    return (
        EngineBuilder()
        .paged_attention("on", prefix_caching=prefix_caching, block_size=16)
        .kv_cache_memory(bytes=24 << 20)
        .scheduler(max_model_len=256, max_num_seqs=8)
        .build(loaded=loaded)
    )


def run(eng, ids):
    got = {request_id: [] for request_id in ids}
    for out in eng.stream():
        got[out.request_id] += out.new_token_ids
    return [tuple(got[request_id]) for request_id in ids]


@pytest.fixture(scope="module")
def alone(smollm2_fp32):
    """Each choice as a request of its own, seeds 7, 8, 9, 10."""
    eng = engine(smollm2_fp32)
    outputs = []
    for seed in range(7, 11):
        ids = [eng.add_request(PROMPT, dataclasses.replace(SAMPLED, seed=seed))]
        outputs += run(eng, ids)
    assert len(set(outputs)) > 1  # the seeds make different samples
    return outputs


def collect(got, outputs):
    for out in outputs:
        got[out.request_id] += out.new_token_ids


@pytest.mark.parametrize("prefix_caching", ["off", "on"])
def test_four_choices_share_the_prompts_blocks_and_match_four_seeded_requests(
    smollm2_fp32, alone, prefix_caching
):
    eng = engine(smollm2_fp32, prefix_caching)
    request = eng.prepare(PROMPT, SAMPLED, "story")
    num_prompt_tokens = len(request.prompt_ids)
    assert num_prompt_tokens % 16 not in (0, 1)  # a part-filled last block to copy
    ids = eng.add_choices(request, 4)
    assert ids == ["story", "story-1", "story-2", "story-3"]
    got = {request_id: [] for request_id in ids}
    collect(got, eng.step())  # the prompt less its last token, once
    assert eng.scheduler.stats().kv.num_used_blocks == -(-num_prompt_tokens // 16)
    collect(got, eng.step())  # the four fork, and each computes the last prompt token
    num_full = (num_prompt_tokens - 1) // 16
    assert eng.scheduler.stats().kv.num_used_blocks == num_full + 4  # not 4 x (num_full + 1)
    collect(got, eng.stream())
    assert [tuple(got[request_id]) for request_id in ids] == alone
    kv = eng.scheduler.stats().kv
    assert kv.num_used_blocks == 0 and kv.num_live_tokens == 0


def test_n_must_be_a_positive_integer(smollm2_fp32):
    eng = engine(smollm2_fp32)
    with pytest.raises(InvalidRequestError) as error:
        eng.add_choices(eng.prepare(PROMPT, SAMPLED), 0)
    assert error.value.field == "n"
    assert not eng.has_unfinished
