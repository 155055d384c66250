"""The grammar side of the sampler on a four-token byte-level vocabulary (fast layer): the mask
allows only what the grammar does, a completed grammar is reported, a grammar the vocabulary
cannot begin or a tokenizer the engine cannot read is refused naming the field, and a row that
cannot be masked fails alone."""

from __future__ import annotations

import pytest
import tokenizers
import torch
from intentserve.worker.engine import grammar
from intentserve.worker.engine.constraint import Constraint, ConstraintKind
from intentserve.worker.engine.grammar import GrammarCompiler
from intentserve.worker.engine.sampler import Sampler
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams
from intentserve.worker.model.tokenizer import Tokenizer
from tokenizers import decoders, models

A, B, AB, EOS = 0, 1, 2, 3
VOCAB = 6  # the model's logits are wider than the tokenizer (padding), as some checkpoints'


def tiny_tokenizer(byte_level: bool = True) -> Tokenizer:
    backend = tokenizers.Tokenizer(
        models.BPE(vocab={"a": A, "b": B, "ab": AB}, merges=[("a", "b")])
    )
    backend.add_special_tokens(["<eos>"])
    if byte_level:
        backend.decoder = decoders.ByteLevel()
    return Tokenizer(
        backend, bos_token_id=None, eos_token_ids=[EOS], add_bos_token=False, chat_template=None
    )


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(tiny_tokenizer())


def regex(pattern: str, **fields) -> SamplingParams:
    return SamplingParams(constraint=Constraint(ConstraintKind.REGEX, pattern), **fields)


def test_the_mask_allows_only_what_the_grammar_does_and_completion_is_reported(compiler):
    sampler = Sampler((EOS,), compiler)
    # The model prefers `b`, then the columns past the tokenizer's vocabulary; "a+" allows `a`.
    step = sampler.sample(torch.tensor([[1.0, 9.0, 0.0, 0.0, 5.0, 5.0]]), ["r"], [regex("a+")])
    assert step.tokens == {"r": A} and step.complete == frozenset()
    # "a" matches now: `a` or EOS may follow; EOS, the likelier, ends the grammar.
    step = sampler.sample(torch.tensor([[0.5, 9.0, 0.0, 1.0, 5.0, 5.0]]), ["r"], [regex("a+")])
    assert step.tokens == {"r": EOS} and step.complete == {"r"}


def test_a_grammar_that_can_only_end_completes_on_its_last_token(compiler):
    sampler = Sampler((EOS,), compiler)
    step = sampler.sample(torch.tensor([[1.0, 9.0, 0.0, 0.0, 5.0, 5.0]]), ["r"], [regex("ab")])
    assert step.tokens == {"r": AB} and step.complete == {"r"}


def test_a_sampled_row_draws_only_allowed_tokens(compiler):
    sampler = Sampler((EOS,), compiler)
    params = [regex("b+", temperature=1.0, seed=s) for s in range(16)]
    step = sampler.sample(torch.zeros(16, VOCAB), [f"r{i}" for i in range(16)], params)
    assert set(step.tokens.values()) == {B}


def test_constrained_and_free_rows_share_a_step(compiler):
    sampler = Sampler((EOS,), compiler)
    logits = torch.tensor([[0.0, 0.0, 9.0, 0.0, 0.0, 0.0]] * 2)
    step = sampler.sample(logits, ["free", "held"], [SamplingParams(), regex("a")])
    assert step.tokens == {"free": AB, "held": A}
    assert step.complete == {"held"}


def test_a_grammar_no_token_can_begin_is_refused_naming_the_field(compiler):
    with pytest.raises(InvalidRequestError) as caught:
        compiler.compile(Constraint(ConstraintKind.REGEX, "c"))
    assert caught.value.field == "constraint.regex"
    assert "no token of this model's vocabulary" in str(caught.value)


def test_a_tokenizer_the_engine_cannot_read_is_refused_naming_the_field():
    unreadable = GrammarCompiler(tiny_tokenizer(byte_level=False))
    for _ in range(2):  # the reason is kept
        with pytest.raises(InvalidRequestError) as caught:
            unreadable.compile(Constraint(ConstraintKind.JSON_OBJECT))
        assert caught.value.field == "constraint"
        assert "cannot be read by the grammar engine" in str(caught.value)


def test_a_row_that_cannot_be_masked_fails_alone():
    unreadable = Sampler((EOS,), GrammarCompiler(tiny_tokenizer(byte_level=False)))
    logits = torch.tensor([[0.0, 0.0, 9.0, 0.0, 0.0, 0.0]] * 2)
    step = unreadable.sample(logits, ["free", "held"], [SamplingParams(), regex("a")])
    assert step.tokens == {"free": AB}
    assert "cannot be read by the grammar engine" in step.failures["held"]


def test_a_sampler_without_a_vocabulary_fails_constrained_rows_alone():
    step = Sampler().sample(torch.zeros(2, VOCAB), ["free", "held"], [SamplingParams(), regex("a")])
    assert step.tokens == {"free": 0}
    assert step.failures["held"].startswith("constraint: ")


def test_the_compile_is_cached_per_constraint_and_bounded():
    compiler = GrammarCompiler(tiny_tokenizer(), max_cached=2)
    first, second, third = (Constraint(ConstraintKind.REGEX, p) for p in ("a+", "b+", "ab"))
    compiler.compile(first)
    compiler.compile(Constraint(ConstraintKind.REGEX, "a+"))  # equal: a hit
    assert compiler.num_compiles == 1
    compiler.compile(second)
    compiler.compile(third)  # evicts `first`, the least recently used
    compiler.compile(third)
    assert compiler.num_compiles == 3
    compiler.compile(first)
    assert compiler.num_compiles == 4


def test_each_request_gets_its_own_matcher_from_the_cache(compiler):
    """Two requests with one schema in one batch advance apart."""
    sampler = Sampler((EOS,), compiler)
    logits = torch.tensor([[9.0, 1.0, 0.0, 0.0, 0.0, 0.0], [1.0, 9.0, 0.0, 0.0, 0.0, 0.0]])
    first = sampler.sample(logits, ["x", "y"], [regex("(a|b)b")] * 2)
    assert first.tokens == {"x": A, "y": B}
    second = sampler.sample(torch.zeros(2, VOCAB), ["x", "y"], [regex("(a|b)b")] * 2)
    assert second.tokens == {"x": B, "y": B} and second.complete == {"x", "y"}


@pytest.mark.parametrize("deep", ["[" * 5000 + "]" * 5000, '{"a":' * 5000 + "1" + "}" * 5000])
def test_json_nested_past_the_parsers_depth_is_refused_naming_the_field(deep):
    """A schema, or a tool call's arguments or a tool's parameters, nested past what Python's
    JSON parser recurses into: InvalidRequestError naming the field, not a RecursionError (the
    router refuses such JSON first, at 32 levels; this is the worker's own guard)."""
    from intentserve.worker.engine.chat import _json_object

    with pytest.raises(InvalidRequestError) as refused:
        Constraint(ConstraintKind.JSON_SCHEMA, deep)
    assert refused.value.field == "constraint.json_schema"  # the wire name (sampling.constraint)
    assert "nested too deep" in str(refused.value)
    with pytest.raises(InvalidRequestError) as refused:
        _json_object(deep, "tools[0].parameters")
    assert refused.value.field == "tools[0].parameters" and "nested too deep" in str(refused.value)


def test_a_vocabulary_built_before_serving_is_the_one_a_constrained_request_uses(monkeypatch):
    # NOTE: llguidance builds a vocabulary in one call that holds the GIL (2.6 s for Gemma 3):
    # built at a first constrained request, it silenced a worker's heartbeats until the
    # controller lost it. Built beforehand (as a worker does before it registers), no request
    # builds one again, also with a compiler made later on an equal tokenizer.
    tokenizer = tiny_tokenizer()
    tokenizer.backend.add_tokens(["prebuilt"])  # content no other test's tokenizer has
    said = grammar.prebuild_vocabulary(tokenizer)
    assert said.startswith(f"grammar vocabulary of {tokenizer.vocab_size} tokens built in ")

    def no_build(*args, **kwargs):
        raise AssertionError("a constrained request built the vocabulary again")

    monkeypatch.setattr(grammar.llguidance, "LLTokenizer", no_build)
    other = tiny_tokenizer()
    other.backend.add_tokens(["not prebuilt"])
    later = GrammarCompiler(other)
    with pytest.raises(AssertionError, match="built the vocabulary again"):
        later.compile(Constraint(ConstraintKind.REGEX, "a+"))  # another tokenizer: built
    reused = GrammarCompiler(tokenizer)
    reused.compile(Constraint(ConstraintKind.REGEX, "a+"))
    assert reused.num_compiles == 1


def test_a_tokenizer_the_engine_cannot_read_is_said_when_prebuilt():
    said = grammar.prebuild_vocabulary(tiny_tokenizer(byte_level=False))
    assert said.startswith("the grammar engine cannot read this tokenizer (")
