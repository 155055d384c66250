"""The sampler is numerically safe for every value SamplingParams accepts: extreme temperatures,
top-k and top-p at their edges, logits anywhere in the float32 range. A row it cannot sample
(logits that are not finite) fails alone, as a value, never as an exception."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from intentserve.worker.engine.logits_processing import process_logits
from intentserve.worker.engine.sampler import Sampler
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams

VOCAB = 48
logits_rows = st.lists(
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    min_size=VOCAB,
    max_size=VOCAB,
)
temperatures = st.one_of(
    st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 5e-324, 1e-320, 1e-45, 1e-40, 1e-38, 1e-30, 1e-7, 1.0, 1e38, 1.7e308]),
)
top_ps = st.one_of(
    st.floats(min_value=0.0, max_value=1.0, exclude_min=True),
    st.sampled_from([5e-324, 1e-300, 1.0]),
)
top_ks = st.integers(min_value=0, max_value=VOCAB + 8)
seeds = st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 - 1))


def sample(logits: list[list[float]], params: list[SamplingParams]):
    """(tokens, failures) by row id `r<i>`."""
    result = Sampler().sample(
        torch.tensor(logits, dtype=torch.float32), [f"r{i}" for i in range(len(params))], params
    )
    return result.tokens, result.failures


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logits_rows, temperatures, top_ks, top_ps, seeds)
def test_every_accepted_value_samples_a_token_the_parameters_allow(
    row, temperature, top_k, top_p, seed
):
    params = SamplingParams(
        max_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed
    )
    tokens, failures = sample([row], [params])
    assert failures == {}
    token = tokens["r0"]
    assert 0 <= token < VOCAB
    values = torch.tensor(row, dtype=torch.float64)
    if top_k:
        kth = torch.topk(values, min(top_k, VOCAB)).values[-1]
        assert values[token] >= kth
    best, second = torch.topk(values, 2).values.tolist()
    # exp(-(best - second) / temperature) is 0 in float64: only a best token can be drawn.
    if temperature == 0.0 or (best - second) / temperature > 800:
        assert values[token] == best


@pytest.mark.parametrize("temperature", [1e-38, 1e-40, 5e-324, 1e-300])
def test_a_temperature_that_overflows_the_logits_is_greedy(temperature):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(4, 1000, generator=gen) * 5).tolist()
    greedy = SamplingParams(max_tokens=1)
    tiny = SamplingParams(max_tokens=1, temperature=temperature, seed=1)
    expected, _ = sample(logits, [greedy] * 4)
    got, failures = sample(logits, [tiny] * 4)
    assert (got, failures) == (expected, {})


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_row_whose_logits_are_not_finite_fails_alone(bad, temperature):
    logits = [[0.0, 1.0, 2.0, 0.5]] * 3
    logits[1] = [0.0, bad, 2.0, 0.5]
    params = SamplingParams(max_tokens=1, temperature=temperature, seed=1)
    tokens, failures = sample(logits, [params] * 3)
    assert set(failures) == {"r1"} and "not finite" in failures["r1"]
    assert set(tokens) == {"r0", "r2"}


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1e38])
def test_minus_infinity_is_a_token_never_drawn(temperature):
    logits = [[-math.inf, 1.0, -math.inf, 0.5]] * 64
    params = [SamplingParams(max_tokens=1, temperature=temperature, seed=i) for i in range(64)]
    tokens, failures = sample(logits, params)
    assert failures == {} and set(tokens.values()) <= {1, 3}


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("temperature", [math.inf, -math.inf, math.nan, -1.0]),
        ("top_p", [0.0, 1.5, math.nan, math.inf]),
        ("top_k", [-1, 1.5]),
        ("seed", [-1, 2**64, 1.5, "7"]),
    ],
)
def test_values_the_sampler_cannot_use_are_refused_naming_the_field(field, values):
    for value in values:
        with pytest.raises(InvalidRequestError) as info:
            SamplingParams(max_tokens=1, **{field: value})
        assert info.value.field == field


def test_draws_follow_the_temperature_scaled_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    params = SamplingParams(max_tokens=1, temperature=0.5)
    sampler = Sampler()
    counts = torch.zeros(4)
    for _ in range(4000):
        counts[sampler.sample(logits.clone(), ["r"], [params]).tokens["r"]] += 1
    expected = torch.softmax(logits[0] / 0.5, dim=-1)
    assert torch.allclose(counts / 4000, expected, atol=0.03)


def test_a_seeded_rows_draws_do_not_depend_on_its_batch():
    gen = torch.Generator().manual_seed(1)
    row = torch.randn(1, VOCAB, generator=gen)
    seeded = SamplingParams(max_tokens=1, temperature=1.0, top_p=0.9, seed=11)
    alone = [Sampler().sample(row.clone(), ["s"], [seeded]).tokens["s"]]
    others = torch.randn(5, VOCAB, generator=gen)
    mates = [SamplingParams(max_tokens=1, temperature=2.0, top_k=3)] * 5
    batched = Sampler().sample(
        torch.cat([others[:2], row, others[2:]]),
        ["a", "b", "s", "c", "d", "e"],
        [*mates[:2], seeded, *mates[2:]],
    )
    assert [batched.tokens["s"]] == alone


class History:
    def __init__(self, prompt, output):
        self.prompt_token_ids, self.output_token_ids = prompt, output


def test_penalties_bias_and_min_tokens_are_applied_as_defined():
    logits = torch.tensor([[4.0, -2.0, 1.0, 3.0, 0.5, 2.0]])
    params = SamplingParams(
        max_tokens=8,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=2.0,
        logit_bias=((4, 10.0),),
        min_tokens=4,
        stop_token_ids=(5,),
    )
    history = History(prompt=[0, 1], output=[3, 3, 2])
    sampler = Sampler(eos_token_ids=(0,))
    got = logits.clone()
    process_logits(got, [params], [history], sampler.eos_token_ids)
    expected = [
        -math.inf,  # EOS below min_tokens
        -2.0 * 2.0,  # seen in the prompt, negative: times the repetition penalty
        1.0 / 2.0 - 0.25 - 0.5,  # once in the output
        3.0 / 2.0 - 2 * 0.25 - 0.5,  # twice
        0.5 + 10.0,  # biased
        -math.inf,  # a stop token id below min_tokens
    ]
    assert got[0].tolist() == pytest.approx(expected)
    assert sampler.sample(logits.clone(), ["r"], [params], [history]).tokens == {"r": 4}


def test_logprobs_come_from_the_logits_before_any_change():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    params = SamplingParams(max_tokens=1, logprobs=2, logit_bias=((3, 50.0),))
    result = Sampler().sample(logits.clone(), ["r"], [params], [History([0], [])])
    expected = torch.log_softmax(logits[0], dim=-1)
    lp = result.logprobs["r"]
    assert result.tokens == {"r": 3} and lp.token_id == 3
    assert lp.logprob == pytest.approx(float(expected[3]))
    assert [t for t, _ in lp.top] == [1, 2]
    assert [v for _, v in lp.top] == pytest.approx([float(expected[1]), float(expected[2])])
