"""Structured outputs on real weights (SmolLM2 and Gemma 3, float32, greedy): the output parses
and validates against its JSON schema, a choice is one of the choices, a regex output matches,
a tool call parses; constrained and unconstrained requests share a batch, each honoured; bad
schemas and patterns are refused naming the field before anything is queued."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.constraint import Constraint, ConstraintKind, grammar_for_tool_choice
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams
from intentserve.worker.model.registry import load_model
from intentserve.worker.sched.sequence import FinishReason

pytestmark = pytest.mark.model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"enum": ["Paris", "London", "Rome"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
# Plain prompts: the Gemma 3 270M GGUF is a base model with no chat template.
ASK = "A person described as JSON with their name, age and city:"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def eng(request):
    loaded = load_model(request.param, dtype="float32")
    return (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=48 << 20)
        .scheduler(max_model_len=512, max_num_seqs=8)
        .build(loaded=loaded)
    )


def constrained(constraint: Constraint, max_tokens: int = 64) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, constraint=constraint)


def parse_tool_call(text: str) -> dict:
    match = re.fullmatch(r"<tool_call>\n(.*)\n</tool_call>", text, re.DOTALL)
    assert match, text
    return json.loads(match.group(1))


def test_each_constraint_is_honoured_beside_a_free_request_in_one_batch(eng):
    """One batch (the machine is shared: one generation per model): a JSON schema, any JSON
    object, a choice, a regex, tool_choice required and named, and an unconstrained request
    whose tokens must be what it gives alone."""
    free = SamplingParams(max_tokens=8, ignore_eos=True)
    alone = eng.generate(["The capital of France is"], free)[0]
    choices = ("positive", "negative", "neutral")
    pattern = r"[a-z]{3,8}@[a-z]{3,8}\.(com|org)"
    requests = {
        "schema": (ASK, constrained(Constraint.json_schema(PERSON))),
        "object": (
            "Give me a JSON object with one key.",
            SamplingParams(
                max_tokens=48,
                temperature=0.7,
                seed=3,
                constraint=Constraint(ConstraintKind.JSON_OBJECT),
            ),
        ),
        "choice": (
            "Is 'I love this film' positive or negative?",
            constrained(Constraint(ConstraintKind.CHOICE, choices=choices)),
        ),
        "regex": (
            "Alan Turing's email address is",
            constrained(Constraint(ConstraintKind.REGEX, pattern)),
        ),
        "required": (
            "What is the weather in Paris?",
            constrained(grammar_for_tool_choice(TOOLS, "required")),
        ),
        "named": (
            "What is the weather in Paris?",
            constrained(
                grammar_for_tool_choice(
                    TOOLS, {"type": "function", "function": {"name": "get_weather"}}
                )
            ),
        ),
        "free": ("The capital of France is", free),
    }
    ids = {name: eng.add_request(prompt, params) for name, (prompt, params) in requests.items()}
    text = {i: "" for i in ids.values()}
    tokens = {i: [] for i in ids.values()}
    finish = {}
    batch_sizes = []
    while eng.has_unfinished:
        outs = eng.step()
        batch_sizes.append(len(outs))
        for out in outs:
            text[out.request_id] += out.new_text
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                finish[out.request_id] = out.finish_reason
    out = {name: text[i] for name, i in ids.items()}
    assert max(batch_sizes) == len(requests)  # they did share steps
    assert tokens[ids["free"]] == list(alone.new_token_ids)
    for name in ("schema", "choice", "regex", "required", "named"):
        assert finish[ids[name]] == FinishReason.STOP, (name, out[name])
    jsonschema.validate(json.loads(out["schema"]), PERSON)
    if finish[ids["object"]] == FinishReason.STOP:
        assert isinstance(json.loads(out["object"]), dict)
    else:  # cut by max_tokens: a prefix of an object, never anything else
        assert out["object"].lstrip().startswith("{")
    assert out["choice"] in choices
    assert re.fullmatch(pattern, out["regex"]), out["regex"]
    required = parse_tool_call(out["required"])
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    jsonschema.validate(required["arguments"], schema[required["name"]])
    named = parse_tool_call(out["named"])
    assert named["name"] == "get_weather"
    jsonschema.validate(named["arguments"], schema["get_weather"])


@pytest.mark.parametrize(
    ("constraint", "field", "problem"),
    [
        (lambda: Constraint(ConstraintKind.REGEX, "a(b"), "constraint.regex", "unclosed group"),
        (lambda: Constraint(ConstraintKind.REGEX, "(?=a)b"), "constraint.regex", "look-around"),
        (
            lambda: Constraint.json_schema(
                {"type": "object", "properties": {"a": {"$ref": "#/x"}}}
            ),
            "constraint.json_schema",
            "/x",
        ),
        (
            lambda: Constraint.json_schema({"type": "nonsense"}),
            "constraint.json_schema",
            "nonsense",
        ),
        (
            lambda: Constraint(ConstraintKind.JSON_SCHEMA, "{not json"),
            "constraint.json_schema",
            "not valid JSON",
        ),
        (lambda: Constraint(ConstraintKind.CHOICE, choices=()), "constraint.choice", "0 choices"),
    ],
)
def test_a_bad_constraint_is_refused_naming_the_field(eng, constraint, field, problem):
    with pytest.raises(InvalidRequestError) as caught:
        eng.prepare("Hi", constrained(constraint()))
    assert caught.value.field == field
    assert problem in str(caught.value)


def test_tool_choice_refuses_what_it_cannot_enforce():
    assert grammar_for_tool_choice(TOOLS, "auto") is None
    assert grammar_for_tool_choice(TOOLS, "none") is None
    with pytest.raises(InvalidRequestError) as caught:
        grammar_for_tool_choice(TOOLS, {"type": "function", "function": {"name": "nope"}})
    assert caught.value.field == "tool_choice"
    with pytest.raises(InvalidRequestError) as caught:
        grammar_for_tool_choice([], "required")
    assert caught.value.field == "tools"
    with pytest.raises(InvalidRequestError) as caught:
        grammar_for_tool_choice([{"type": "code_interpreter"}], "required")
    assert caught.value.field == "tools[0]"
