"""reasoning.py: a thinking model's format found in its template and vocabulary, and the splitter
that routes a reply's text deltas to its reasoning or to its reply, whatever the deltas' cuts."""

from __future__ import annotations

import pytest
from intentserve.worker.engine.reasoning import (
    Phase,
    ReasoningFormat,
    ReasoningSplitter,
    detect_reasoning,
    reply_phase,
)
from intentserve.worker.model.tokenizer import Tokenizer
from tokenizers import AddedToken

from tests.worker.model.tiny_checkpoints import CHAT_TEMPLATE, tiny_tokenizer

THINK = ReasoningFormat("<think>", "</think>")
OPENED = ReasoningFormat("<think>", "</think>", opened_by_template=True)
TURNS = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% if m['role'] == 'assistant' %}<think></think>{% endif %}{% endfor %}"
)
THINKING_TEMPLATE = TURNS + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
OPENING_TEMPLATE = (
    TURNS + "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def split(text: str, fmt: ReasoningFormat = THINK, cuts: int | None = None, phase=None):
    """(reasoning, content) of `text` fed in pieces of `cuts` characters (None: whole), and
    every piece the splitter emitted, to check that no marker leaks in parts."""
    splitter = ReasoningSplitter(fmt, phase)
    pieces = [text] if cuts is None else [text[i : i + cuts] for i in range(0, len(text), cuts)]
    emitted = [splitter.feed(p) for p in pieces] + [splitter.finish()]
    reasoning = "".join(r for r, _ in emitted)
    content = "".join(c for _, c in emitted)
    return reasoning, content, emitted


REPLY = "<think>\nThe user greets.\n</think>\n\nHello!"


@pytest.mark.parametrize("cuts", [None, 1, 2, 3, 5, 7, 8])
def test_thinking_then_reply_whatever_the_cuts(cuts):
    reasoning, content, emitted = split(REPLY, cuts=cuts)
    assert (reasoning, content) == ("\nThe user greets.\n", "Hello!")
    for r, c in emitted:  # no piece carries any part of a marker
        assert "<" not in r + c and ">" not in r + c


def test_a_marker_split_over_one_character_deltas_is_held_until_known():
    splitter = ReasoningSplitter(THINK)
    assert [splitter.feed(ch) for ch in "<thi"] == [("", "")] * 4
    assert splitter.feed("nk>") == ("", "")
    assert splitter.feed("ab") == ("ab", "")
    assert splitter.feed("</") == ("", "")
    assert splitter.feed("x") == ("</x", "")  # not the end marker after all: reasoning
    assert splitter.feed("</think>") == ("", "")
    assert splitter.feed("\n") == ("", "")  # whitespace after the end marker is dropped
    assert splitter.feed("\nhi ") == ("", "hi ")
    assert splitter.feed(" there") == ("", " there")  # only right after the marker


def test_no_markers_at_all_is_all_content():
    text = "Just an answer, 1 < 2 and a > b."
    for cuts in (None, 1):
        reasoning, content, _ = split(text, cuts=cuts)
        assert (reasoning, content) == ("", text)


def test_a_lone_less_than_sign_is_released_once_it_cannot_start_a_marker():
    splitter = ReasoningSplitter(THINK)
    assert splitter.feed("a <") == ("", "a ")
    assert splitter.feed("b") == ("", "<b")


def test_unfinished_thinking_at_finish_is_all_reasoning():
    reasoning, content, _ = split("<think>still thinking</thi", cuts=1)
    assert (reasoning, content) == ("still thinking</thi", "")


def test_a_half_start_marker_at_finish_is_content():
    reasoning, content, _ = split("see <thi", cuts=1)
    assert (reasoning, content) == ("", "see <thi")


def test_opened_by_the_template_starts_inside_the_reasoning():
    text = "I should greet.\n</think>\n\nHello!"
    for cuts in (None, 1):
        assert split(text, OPENED, cuts)[:2] == ("I should greet.\n", "Hello!")
    # The same text from a template that opens nothing: no start marker, all content.
    assert split(text, THINK)[:2] == ("", text)


def test_opened_by_the_template_and_never_closed_is_all_reasoning():
    assert split("thinking on and on", OPENED, 3)[:2] == ("thinking on and on", "")


def test_text_before_the_start_marker_is_content():
    assert split("Well. <think>hmm</think> Yes.")[:2] == ("hmm", "Well. Yes.")


def test_only_the_first_block_is_reasoning():
    text = "<think>a</think>\n\nReply <think>b</think> end"
    for cuts in (None, 1, 4):
        assert split(text, cuts=cuts)[:2] == ("a", "Reply <think>b</think> end")


def test_empty_thinking_and_empty_reply():
    assert split("<think></think>")[:2] == ("", "")
    assert split("<think>\n\n</think>\n\nOk", cuts=1)[:2] == ("\n\n", "Ok")


def test_whitespace_only_after_the_end_marker_is_dropped_across_deltas():
    splitter = ReasoningSplitter(THINK)
    assert splitter.feed("<think>x</think>") == ("x", "")
    assert splitter.feed(" \n") == ("", "")
    assert splitter.feed("\t") == ("", "")
    assert splitter.feed(" A\n\nB") == ("", "A\n\nB")
    assert splitter.finish() == ("", "")


def test_a_given_phase_overrides_the_format():
    assert split("x</think>y", OPENED, phase=Phase.AFTER)[:2] == ("", "x</think>y")
    assert split("x</think>y", THINK, phase=Phase.INSIDE)[:2] == ("x", "y")


def test_reply_phase_reads_the_rendered_prompt():
    assert reply_phase(THINK, "<|im_start|>assistant\n<think>\n") is Phase.INSIDE
    assert reply_phase(THINK, "<|im_start|>assistant\n<think>\n\n</think>\n\n") is Phase.AFTER
    assert reply_phase(THINK, "<|im_start|>assistant\n") is Phase.BEFORE


def test_describe():
    assert THINK.describe() == "reasoning between <think> and </think>"
    assert OPENED.describe() == "reasoning between <think> and </think>, opened by the template"


# -- detect_reasoning ------------------------------------------------------------------------


def tokenizer(template: str | None, *, markers: bool = True, special: bool = False) -> Tokenizer:
    backend = tiny_tokenizer()
    if markers:
        added = [AddedToken(t, special=special, normalized=False) for t in ("<think>", "</think>")]
        if special:
            backend.add_special_tokens(added)
        else:
            backend.add_tokens(added)
    return Tokenizer(
        backend, bos_token_id=1, eos_token_ids=(2,), add_bos_token=False, chat_template=template
    )


def test_a_thinking_template_and_vocabulary_give_the_format():
    assert detect_reasoning(tokenizer(THINKING_TEMPLATE)) == THINK


def test_a_template_that_opens_the_thinking_is_told():
    assert detect_reasoning(tokenizer(OPENING_TEMPLATE)) == OPENED


def test_a_template_without_the_markers_is_no_thinking_model():
    assert detect_reasoning(tokenizer(CHAT_TEMPLATE)) is None


def test_no_template_is_no_thinking_model():
    assert detect_reasoning(tokenizer(None)) is None


def test_markers_that_are_no_tokens_are_no_thinking_model():
    assert detect_reasoning(tokenizer(THINKING_TEMPLATE, markers=False)) is None


def test_markers_that_decoding_drops_are_no_thinking_model():
    # Special tokens are left out of a reply's text, so the splitter would never see them.
    assert detect_reasoning(tokenizer(THINKING_TEMPLATE, special=True)) is None


def test_a_template_that_refuses_a_lone_user_turn_still_thinks():
    refusing = "{{ raise_exception('needs a system turn') }}<think></think>"
    assert detect_reasoning(tokenizer(refusing)) == THINK
