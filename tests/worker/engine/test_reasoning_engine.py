"""A thinking model on the engine: its reasoning format realized and reported, a chat reply split
into its thinking and its text as it streams, a thinking budget that ends the thinking (the end
marker written in place of what the model would have sampled), and a budget refused by name
where it cannot be honoured. The model is a tiny random-weight Llama whose template opens the
thinking (as Qwen3's does) and whose vocabulary has the markers as tokens."""

from __future__ import annotations

import pytest
from intentserve.policy import ReasoningFormat
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.chat import Conversation
from intentserve.worker.engine.constraint import Constraint, ConstraintKind
from intentserve.worker.engine.request import joined
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams
from intentserve.worker.model.registry import load_model
from intentserve.worker.model.tokenizer import IncrementalDecoder

from tests.worker.model.tiny_checkpoints import write_thinking_folder

OPENED = ReasoningFormat("<think>", "</think>", opened_by_template=True)
HI = Conversation.user("Hello")


@pytest.fixture(scope="module")
def thinking(tmp_path_factory):
    folder = write_thinking_folder(tmp_path_factory.mktemp("thinking"))
    loaded = load_model(str(folder), dtype="float32")
    return (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=128, max_num_seqs=8)
        .build(loaded=loaded)
    )


def params(**kwargs) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 12, "ignore_eos": True, **kwargs})


def reply(engine, prompt=HI, **kwargs):
    """The joined output and every delta of one request, run alone."""
    request_id = engine.add_request(prompt, params(**kwargs))
    deltas = [out for out in engine.stream() if out.request_id == request_id]
    return joined(deltas), deltas


def end_id(engine) -> int:
    return engine.tokenizer.backend.token_to_id("</think>")


def text_of(engine, ids, prompt=HI, chat=False) -> str:
    """The text `ids` make after `prompt`, as the engine detokenizes them unsplit (a random
    model's bytes are not always whole characters: what never completes one is not text)."""
    decoder = IncrementalDecoder(
        engine.tokenizer, engine.prepare(prompt, params(), chat=chat).prompt_ids
    )
    return "".join(decoder.append([i]) for i in ids)


def split_at_the_end_marker(text: str) -> tuple[str, str]:
    reasoning, _, rest = text.partition("</think>")
    return reasoning, rest.lstrip()


def test_the_format_is_realized_and_described(thinking):
    assert thinking.realized.cache.reasoning == OPENED
    assert "reasoning between <think> and </think>, opened by the template" in (
        thinking.realized.describe()
    )


def test_a_model_without_markers_realizes_none(tiny_engine):
    assert tiny_engine().realized.cache.reasoning is None


@pytest.mark.parametrize("budget", [0, 1, 3, 7])
def test_a_budget_ends_the_thinking_after_that_many_tokens(thinking, budget):
    out, deltas = reply(thinking, reasoning_budget=budget)
    ids = list(out.new_token_ids)
    # The model's own tokens until the budget, then the end marker in their place.
    assert ids.index(end_id(thinking)) == budget
    text = text_of(thinking, ids)
    assert (out.new_reasoning, out.new_text) == split_at_the_end_marker(text)
    assert len(ids) == 12  # the marker counts as an output token, max_tokens holds
    assert out.num_reasoning_tokens == budget  # the thinking's tokens, the marker not counted
    for d in deltas:  # no delta carries any part of a marker
        assert "think>" not in d.new_reasoning + d.new_text


def test_without_a_budget_the_thinking_runs_as_the_model_has_it(thinking):
    out, _ = reply(thinking)
    ids = list(out.new_token_ids)
    assert end_id(thinking) not in ids  # this random model never closes its thinking
    assert out.num_reasoning_tokens == len(ids)
    assert (out.new_reasoning, out.new_text) == (text_of(thinking, ids), "")


def test_a_budget_changes_nothing_before_it_is_spent(thinking):
    free, _ = reply(thinking)
    budgeted, _ = reply(thinking, reasoning_budget=5)
    assert budgeted.new_token_ids[:5] == free.new_token_ids[:5]


def test_each_choice_keeps_its_own_budget(thinking):
    request_id = thinking.add_request(HI, params(reasoning_budget=2, temperature=1.0, seed=3))
    thinking.abort(request_id)
    prepared = thinking.prepare(HI, params(reasoning_budget=2, temperature=1.0, seed=3))
    ids = thinking.add_choices(prepared, 3)
    deltas = {i: [] for i in ids}
    for out in thinking.stream():
        deltas[out.request_id].append(out)
    for i in ids:
        assert list(joined(deltas[i]).new_token_ids).index(end_id(thinking)) == 2


def test_a_text_chat_is_split_too(thinking):
    request_id = thinking.add_request("Hello", params(reasoning_budget=1), chat=True)
    out = joined([o for o in thinking.stream() if o.request_id == request_id])
    assert out.new_token_ids[1] == end_id(thinking)
    text = text_of(thinking, out.new_token_ids, prompt="Hello", chat=True)
    assert (out.new_reasoning, out.new_text) == split_at_the_end_marker(text)


def test_a_completion_is_not_split(thinking):
    out, _ = reply(thinking, prompt="Hello")
    assert (out.new_reasoning, out.num_reasoning_tokens) == ("", 0)
    assert out.new_text == text_of(thinking, out.new_token_ids, prompt="Hello")


@pytest.mark.parametrize(
    ("prompt", "extra", "says"),
    [
        ("Hello", {}, "applies to a chat reply"),
        (HI, {"constraint": Constraint(ConstraintKind.REGEX, "[ab]+")}, "structured outputs"),
        (HI, {"logprobs": 1}, "not served with logprobs"),
    ],
)
def test_a_budget_that_cannot_be_honoured_is_refused_by_name(thinking, prompt, extra, says):
    with pytest.raises(InvalidRequestError) as error:
        thinking.prepare(prompt, params(reasoning_budget=4, **extra))
    assert error.value.field == "reasoning_budget"
    assert says in str(error.value)


def test_a_budget_for_a_model_that_does_not_think_is_refused_by_name(tiny_engine):
    with pytest.raises(InvalidRequestError) as error:
        tiny_engine().prepare(HI, params(reasoning_budget=4))
    assert error.value.field == "reasoning_budget"
    assert "does not think" in str(error.value)


@pytest.mark.parametrize("budget", [-1, 1.5, "4"])
def test_a_budget_that_is_no_count_is_refused_by_name(budget):
    with pytest.raises(InvalidRequestError) as error:
        params(reasoning_budget=budget)
    assert error.value.field == "reasoning_budget"


def test_a_grammar_reply_of_a_thinking_model_is_all_text(thinking):
    out, _ = reply(thinking, constraint=Constraint(ConstraintKind.REGEX, "[ab]+"), max_tokens=4)
    assert out.new_reasoning == ""
    assert set(out.new_text) <= {"a", "b"}
