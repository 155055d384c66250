"""One request can only harm itself: a poisoned request among innocent ones in the same batch.

A tiny random-weight model, so the whole engine (scheduler, paged KV, model, sampler, stop checks)
runs in the fast layer.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from intentserve.worker.engine.request import RequestState
from intentserve.worker.engine.sampler import Sampler
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.sched.sequence import FinishReason

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
SAMPLED = replace(GREEDY, temperature=0.8, top_p=0.9, seed=7)
INNOCENTS = [
    ("innocent-0", "hello world", GREEDY),
    ("innocent-1", "The quick brown fox", SAMPLED),
    ("innocent-2", "def add(a, b):", GREEDY),
    ("innocent-3", "Numbers 0123456789", replace(SAMPLED, seed=8, top_k=5)),
    ("innocent-4", "café, naïve", GREEDY),
    ("innocent-5", "jumps over the lazy dog", replace(SAMPLED, seed=9)),
]
POISON = ("poison", "Hello world! Numbers", GREEDY)


def run(engine, requests) -> dict[str, tuple]:
    """Every request added before the first step, so all share each batch; per request: its
    tokens, its text, how it finished and why it failed (if it did)."""
    for request_id, prompt, params in requests:
        engine.add_request(prompt, params, request_id)
    tokens: dict[str, list[int]] = {request_id: [] for request_id, _, _ in requests}
    text = {request_id: "" for request_id, _, _ in requests}
    finished = {}
    for out in engine.stream():
        tokens[out.request_id] += out.new_token_ids
        text[out.request_id] += out.new_text
        if out.finished:
            finished[out.request_id] = (out.finish_reason, out.error)
    return {r: (tuple(tokens[r]), text[r], *finished.get(r, (None, ""))) for r in tokens}


def assert_idle(engine) -> None:
    assert not engine.has_unfinished
    assert engine.scheduler.stats().kv.num_used_blocks == 0


@pytest.mark.parametrize("temperature", [1e-38, 1e-40, 5e-324])
def test_a_temperature_that_overflows_the_logits_samples_greedily_and_harms_no_one(
    tiny_engine, temperature
):
    """logits / 1e-38 overflows float32: the request behaves as greedy, its batch mates as if
    it were not there."""
    reference = run(tiny_engine(), [*INNOCENTS, POISON])
    request_id, prompt, params = POISON
    poison = (request_id, prompt, replace(params, temperature=temperature, seed=3))
    engine = tiny_engine()
    assert run(engine, [*INNOCENTS, poison]) == reference
    assert_idle(engine)


POISON_SEED = 666
FAILS_AT_TOKEN = 3


def inject_sampling_failure(monkeypatch):
    seeded_noise = Sampler._seeded_noise

    def failing(sampler, seq_id, params, vocab):
        if params.seed == POISON_SEED:
            raise RuntimeError("injected sampling failure")
        return seeded_noise(sampler, seq_id, params, vocab)

    monkeypatch.setattr(Sampler, "_seeded_noise", failing)
    request_id, prompt, _ = POISON
    return (request_id, prompt, replace(SAMPLED, seed=POISON_SEED)), 0


def inject_stop_check_failure(monkeypatch):
    on_token = RequestState.on_token

    def failing(state, token_id):
        if state.request_id == POISON[0] and state.num_emitted_tokens == FAILS_AT_TOKEN:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected detokenizing failure")
        return on_token(state, token_id)

    monkeypatch.setattr(RequestState, "on_token", failing)
    return POISON, FAILS_AT_TOKEN


@pytest.mark.parametrize(
    ("inject", "stage"),
    [
        (inject_sampling_failure, "sampling: RuntimeError: injected sampling failure"),
        (inject_stop_check_failure, "detokenizing or stop checks: UnicodeDecodeError"),
    ],
    ids=["sampling", "detokenizing"],
)
def test_an_error_that_belongs_to_one_request_ends_it_alone(
    tiny_engine, monkeypatch, inject, stage
):
    reference = run(tiny_engine(), INNOCENTS)
    poison, num_tokens_before = inject(monkeypatch)
    engine = tiny_engine()
    got = run(engine, [*INNOCENTS, poison])
    assert {r: got[r] for r in reference} == reference
    tokens, _, finish_reason, error = got[poison[0]]
    assert finish_reason is FinishReason.ERROR and error.startswith(stage)
    assert len(tokens) == num_tokens_before
    assert_idle(engine)
