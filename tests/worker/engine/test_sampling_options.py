"""What applications ask of the sampler, through the engine on a real model (SmolLM2, float32):
logprobs are the model's own log-softmax, logit_bias bans or forces a token, min_tokens holds off
EOS, penalties and min_p change the draw as defined, and a seed gives the same tokens whatever
the batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.chat import Conversation
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams
from intentserve.worker.model.reference_attention import CausalAttention
from intentserve.worker.sched.sequence import FinishReason

pytestmark = pytest.mark.model

PROMPT = "The capital of France is"
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def eng(smollm2_fp32):
    return (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=24 << 20)
        .scheduler(max_model_len=256, max_num_seqs=16)
        .build(loaded=smollm2_fp32)
    )


def one(eng, prompt, params):
    return eng.generate([prompt], params)[0]


def next_token_logits(eng, prompt_ids: list[int]) -> torch.Tensor:
    """The model's logits for the token after `prompt_ids`, with no cache and no sampler."""
    model = eng.runner.model
    ids = torch.tensor(prompt_ids)
    with torch.inference_mode():
        hidden = model(
            ids, torch.arange(len(ids)), CausalAttention(model.config.layer_windows), None
        )
        return model.compute_logits(hidden[-1:])[0].double()


def test_logprobs_are_the_log_softmax_of_the_models_logits(eng):
    params = dataclasses.replace(GREEDY, max_tokens=3, logprobs=5)
    out = one(eng, PROMPT, params)
    assert len(out.logprobs) == 3
    prompt_ids = eng.tokenizer.encode(PROMPT)
    for i, lp in enumerate(out.logprobs):
        expected = torch.log_softmax(
            next_token_logits(eng, prompt_ids + list(out.new_token_ids[:i])), -1
        )
        assert lp.chosen.token_id == out.new_token_ids[i]
        assert lp.chosen.logprob == pytest.approx(float(expected[lp.chosen.token_id]), abs=1e-3)
        top = expected.topk(5)
        assert [e.token_id for e in lp.top] == top.indices.tolist()
        assert [e.logprob for e in lp.top] == pytest.approx(top.values.tolist(), abs=1e-3)
        assert lp.chosen.token == eng.tokenizer.decode([lp.chosen.token_id])


def test_without_logprobs_none_come_back(eng):
    assert one(eng, PROMPT, GREEDY).logprobs == ()


def test_logit_bias_minus_100_bans_a_token_and_plus_100_forces_one(eng):
    reference = one(eng, PROMPT, GREEDY).new_token_ids
    banned = one(eng, PROMPT, dataclasses.replace(GREEDY, logit_bias=((reference[0], -100.0),)))
    assert reference[0] not in banned.new_token_ids
    forced = one(eng, PROMPT, dataclasses.replace(GREEDY, logit_bias=((42, 100.0),)))
    assert set(forced.new_token_ids) == {42}


def test_min_tokens_holds_off_eos(eng):
    chat = Conversation.user("Say hello.")
    params = SamplingParams(max_tokens=64)
    reference = one(eng, chat, params)
    assert reference.finish_reason is FinishReason.STOP  # it ends with EOS by itself
    at_least = reference.num_output_tokens + 4
    held = one(eng, chat, dataclasses.replace(params, min_tokens=at_least))
    assert held.num_output_tokens >= at_least
    eos = set(eng.tokenizer.eos_token_ids)
    assert not eos & set(held.new_token_ids[:at_least])


def test_min_tokens_also_holds_off_stop_token_ids(eng):
    reference = one(eng, PROMPT, GREEDY).new_token_ids
    params = dataclasses.replace(GREEDY, stop_token_ids=(reference[0],), min_tokens=2)
    out = one(eng, PROMPT, params)
    assert out.new_token_ids[0] != reference[0] and out.num_output_tokens == 8


def penalized(logits: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams):
    """The definitions, one token at a time: OpenAI's presence and frequency penalties over the
    output, the repetition penalty over prompt and output."""
    logits = logits.clone()
    for token in set(prompt) | set(output):
        if p.repetition_penalty != 1.0:
            value = logits[token]
            logits[token] = (
                value / p.repetition_penalty if value > 0 else value * p.repetition_penalty
            )
    for token in set(output):
        logits[token] -= p.frequency_penalty * output.count(token) + p.presence_penalty
    return logits


@pytest.mark.parametrize(
    "option",
    [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"repetition_penalty": 2.0},
        {"frequency_penalty": -0.5, "presence_penalty": 0.7, "repetition_penalty": 1.3},
    ],
)
def test_penalties_change_the_distribution_as_defined(eng, option):
    prompt = "The capital of France is Paris. The capital of France is"
    params = dataclasses.replace(GREEDY, max_tokens=12, **option)
    out = list(one(eng, prompt, params).new_token_ids)
    plain = list(one(eng, prompt, dataclasses.replace(GREEDY, max_tokens=12)).new_token_ids)
    prompt_ids = eng.tokenizer.encode(prompt)
    for i, token in enumerate(out):
        logits = next_token_logits(eng, prompt_ids + out[:i])
        assert int(penalized(logits, prompt_ids, out[:i], params).argmax()) == token, i
    assert out != plain  # the penalty changed what was drawn


def test_min_p_1_keeps_only_the_likeliest_token(eng):
    greedy = one(eng, PROMPT, GREEDY).new_token_ids
    sampled = one(eng, PROMPT, dataclasses.replace(GREEDY, temperature=1.5, min_p=1.0))
    assert sampled.new_token_ids == greedy


def test_a_seed_gives_the_same_tokens_alone_and_in_any_batch(eng):
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, seed=7, ignore_eos=True)
    alone = one(eng, PROMPT, seeded).new_token_ids
    mates = SamplingParams(max_tokens=12, temperature=1.3, ignore_eos=True)
    for batch in (["def f(x):", "Once upon", PROMPT], ["A", "B", "C", "D", "E"]):
        prompts = [*batch, PROMPT]
        params_list = [mates] * len(batch) + [seeded]
        ids = [eng.add_request(p, s) for p, s in zip(prompts, params_list, strict=True)]
        got = {i: [] for i in ids}
        for out in eng.stream():
            got[out.request_id] += out.new_token_ids
        assert tuple(got[ids[-1]]) == alone
    other = one(eng, PROMPT, dataclasses.replace(seeded, seed=8)).new_token_ids
    assert other != alone


@pytest.mark.parametrize(
    ("field", "params"),
    [
        ("logit_bias", SamplingParams(logit_bias=((10**6, 1.0),))),
        ("stop_token_ids", SamplingParams(stop_token_ids=(10**6,))),
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused_naming_the_field(eng, field, params):
    with pytest.raises(InvalidRequestError) as info:
        eng.prepare(PROMPT, params)
    assert info.value.field == field


def prompt_scores(eng, prompt_ids: list[int]) -> torch.Tensor:
    """log_softmax of the model's logits at every prompt position, one pass with no cache."""
    model = eng.runner.model
    ids = torch.tensor(prompt_ids)
    with torch.inference_mode():
        hidden = model(
            ids, torch.arange(len(ids)), CausalAttention(model.config.layer_windows), None
        )
        return torch.log_softmax(model.compute_logits(hidden).double(), dim=-1)


@pytest.mark.parametrize(
    ("prefix_caching", "max_num_batched_tokens"), [("on", 2048), ("on", 8), ("off", 2048)]
)
def test_prompt_logprobs_score_each_prompt_token_given_those_before(
    smollm2_fp32, prefix_caching, max_num_batched_tokens
):
    eng = (
        EngineBuilder()
        .paged_attention("on", prefix_caching=prefix_caching, block_size=16)
        .kv_cache_memory(bytes=24 << 20)
        .scheduler(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=max_num_batched_tokens)
        .build(loaded=smollm2_fp32)
    )
    prompt = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
    prompt_ids = eng.tokenizer.encode(prompt)
    assert len(prompt_ids) > 16  # a full block the prefix cache could serve
    expected = prompt_scores(eng, prompt_ids)
    params = dataclasses.replace(GREEDY, max_tokens=2, prompt_logprobs=2)
    for _ in range(2):  # the second time its blocks are in the prefix cache
        out = one(eng, prompt, params)
        scored = out.prompt_logprobs
        assert [s.chosen.token_id for s in scored] == prompt_ids
        assert scored[0].chosen.logprob is None and scored[0].top == ()
        for p, s in enumerate(scored[1:], start=1):
            assert s.chosen.logprob == pytest.approx(
                float(expected[p - 1, prompt_ids[p]]), abs=1e-3
            )
            assert [e.token_id for e in s.top] == expected[p - 1].topk(2).indices.tolist()
    assert one(eng, prompt, GREEDY).prompt_logprobs == ()
