"""A free grammar (vLLM's `structured_outputs.grammar`: Lark, or GBNF) holds the output on the
tiny random-weight engine (fast layer): every sampled output is one the grammar allows; a grammar
that does not compile, an empty one and one over the size bound are refused naming
`constraint.grammar`, with llguidance's reason, before anything is queued."""

from __future__ import annotations

import pytest
from intentserve.worker.engine.constraint import MAX_CONSTRAINT_CHARS, Constraint, ConstraintKind
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams
from intentserve.worker.sched.sequence import FinishReason

LARK = 'start: "yes" | "no"'
GBNF = 'root ::= "yes" | "no"'


def grammar(text: str) -> Constraint:
    return Constraint(ConstraintKind.GRAMMAR, text)


@pytest.mark.parametrize("text", [LARK, GBNF], ids=["lark", "gbnf"])
def test_every_sampled_output_is_one_the_grammar_allows(tiny_engine, text):
    engine = tiny_engine()
    for seed in range(8):
        params = SamplingParams(max_tokens=16, temperature=1.5, seed=seed, constraint=grammar(text))
        engine.add_request("Yes or no?", params, f"r{seed}")
    finished = {}
    texts = {f"r{seed}": "" for seed in range(8)}
    for out in engine.stream():
        texts[out.request_id] += out.new_text
        if out.finished:
            finished[out.request_id] = out.finish_reason
    assert set(texts.values()) <= {"yes", "no"}, texts
    assert set(finished.values()) == {FinishReason.STOP}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('start: ("yes"', "Expected token ')'"),
        ("start: maybe", 'unknown name: "maybe"'),
        ("root ::= (", "GBNF"),
        ("root ::= " + "(" * 100_000 + '"a"' + ")" * 100_000, "GBNF"),
        ("", "must not be empty"),
        ("a" * (MAX_CONSTRAINT_CHARS + 1), f"at most {MAX_CONSTRAINT_CHARS}"),
    ],
)
def test_a_bad_grammar_is_refused_naming_the_field(tiny_engine, text, problem):
    with pytest.raises(InvalidRequestError) as caught:
        tiny_engine().prepare("Hi", SamplingParams(max_tokens=4, constraint=grammar(text)))
    assert caught.value.field == "constraint.grammar"
    assert problem in str(caught.value)
