"""A thinking model's reasoning, told from its reply: the markers its chat template puts the
thinking between (Qwen3's `<think>` and `</think>`), and a splitter that routes a reply's text
deltas to the reasoning or to the reply as they stream.

    format = detect_reasoning(tokenizer)     # None: the model does not think
    splitter = ReasoningSplitter(format)
    reasoning, content = splitter.feed(delta)   # for each text delta, in order
    reasoning, content = splitter.finish()      # what it held back, at the end
    budget = ThinkingBudget(format, phase, 64, end_ids)  # a budget of 64 tokens of thinking
    forced = budget.forced()           # each step: the end marker's next token, or None
    budget.on_token(text_of_the_token_produced)

Only the first `start ... end` block is reasoning: text after it (a second start marker too) is
the reply's. The markers are never emitted, nor half of one: a delta that ends in what could
begin a marker keeps that tail back until the next delta decides it. Whitespace right after the
end marker (the template's "\\n\\n") is not reply text.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from intentserve.policy import ReasoningFormat

THINK_START, THINK_END = "<think>", "</think>"
# The markers looked for in a template and its vocabulary, in order.
KNOWN_MARKERS = ((THINK_START, THINK_END),)


class Phase(enum.Enum):
    """Where a reply's text is, relative to its reasoning block."""

    BEFORE = "before"  # no start marker yet: text is the reply's until one comes
    INSIDE = "inside"  # in the reasoning, until the end marker
    AFTER = "after"  # the reasoning is over (or closed by the prompt): all text is the reply's


def _kept_in_text(tokenizer, marker: str) -> bool:
    """Whether `marker` is one token of the vocabulary that decoding keeps (a special token,
    dropped from a reply's text, could never be seen in it)."""
    token_id = tokenizer.backend.token_to_id(marker)
    return token_id is not None and tokenizer.decode([token_id]).strip() == marker


def detect_reasoning(tokenizer) -> ReasoningFormat | None:
    """The reasoning format of the model `tokenizer` (worker.model.tokenizer.Tokenizer) is for:
    its chat template mentions both markers and its vocabulary has each as a token that decoding
    keeps; None otherwise (no template, or a model that does not think)."""
    template = None if tokenizer is None else tokenizer.chat_template
    if not template:
        return None
    for start, end in KNOWN_MARKERS:
        if start not in template or end not in template:
            continue
        if not (_kept_in_text(tokenizer, start) and _kept_in_text(tokenizer, end)):
            continue
        try:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
        except Exception:  # a stranger's template that refuses a lone user turn opens nothing
            prompt = ""
        return ReasoningFormat(start, end, opened_by_template=prompt.rstrip().endswith(start))
    return None


def reply_phase(format: ReasoningFormat, prompt: str) -> Phase:
    """Where a reply to the rendered `prompt` begins: inside the reasoning when the prompt ends
    with the start marker, after it when the prompt has closed it (Qwen3's
    `enable_thinking: false` renders an empty `<think></think>`), before it otherwise."""
    tail = prompt.rstrip()
    if tail.endswith(format.start):
        return Phase.INSIDE
    if tail.endswith(format.end):
        return Phase.AFTER
    return Phase.BEFORE


def _partial_suffix(text: str, marker: str) -> int:
    """How many of `text`'s last characters could begin `marker` (fewer than all of it)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """One reply's text deltas, in order, split into (reasoning, content) deltas. `phase`: where
    the reply begins (`reply_phase`); None: inside the reasoning when the format's template
    opens it, before it otherwise. The work per delta is its length plus a marker's: nothing
    rescans what came before."""

    def __init__(self, format: ReasoningFormat, phase: Phase | None = None) -> None:
        self.format = format
        if phase is None:
            phase = Phase.INSIDE if format.opened_by_template else Phase.BEFORE
        self.phase = phase
        self._pending = ""  # a tail that could begin the marker awaited, held back
        self._after_end = False  # whitespace right after the end marker is dropped

    def feed(self, delta: str) -> tuple[str, str]:
        """The reasoning and the reply text that `delta` completes (either may be "")."""
        if self.phase is Phase.AFTER:
            return "", self._content(delta)
        text, self._pending = self._pending + delta, ""
        reasoning = content = ""
        if self.phase is Phase.BEFORE:
            i = text.find(self.format.start)
            if i < 0:
                keep = len(text) - _partial_suffix(text, self.format.start)
                self._pending = text[keep:]
                return "", text[:keep]
            content, text = text[:i], text[i + len(self.format.start) :]
            self.phase = Phase.INSIDE
        i = text.find(self.format.end)
        if i < 0:
            keep = len(text) - _partial_suffix(text, self.format.end)
            self._pending = text[keep:]
            return text[:keep], content
        reasoning, text = text[:i], text[i + len(self.format.end) :]
        self.phase, self._after_end = Phase.AFTER, True
        return reasoning, content + self._content(text)

    def finish(self) -> tuple[str, str]:
        """What was held back, at the end of the reply: a marker's beginning that never became
        one is text where it stands (thinking never closed is all reasoning)."""
        pending, self._pending = self._pending, ""
        if self.phase is Phase.INSIDE:
            return pending, ""
        return "", pending

    def _content(self, text: str) -> str:
        if not self._after_end:
            return text
        text = text.lstrip()
        self._after_end = not text
        return text


class ThinkingBudget:
    """A reply's tokens of thinking counted as they come and, at `budget`, its thinking ended:
    the end marker's tokens (`end_ids`) are forced in, one a step, in place of what the model
    would have sampled. Only thinking is counted: the tokens after the start marker until the
    end marker, whether the model opened it or the template did (`phase`); a budget of 0 ends
    the thinking as soon as it opens, None never ends it (the tokens are only counted). The
    model's own end marker ends the count early."""

    def __init__(
        self,
        format: ReasoningFormat,
        phase: Phase,
        budget: int | None,
        end_ids: Sequence[int] = (),
    ) -> None:
        self.format, self.budget, self._end_ids = format, budget, tuple(end_ids)
        self.inside, self.over = phase is Phase.INSIDE, phase is Phase.AFTER
        self.num_tokens = 0  # tokens of thinking so far
        self._forcing: list[int] = []
        self._forced_any = False
        self._tail = ""  # the last characters seen, where a marker may have begun
        self._check()

    def forced(self) -> int | None:
        """The token this step must produce (the end marker's next), or None: the model's own."""
        return self._forcing.pop(0) if self._forcing else None

    def on_token(self, text: str) -> None:
        """The text one produced token added to the reply, in order."""
        if self.over:
            return
        window = self._tail + text
        if not self.inside:
            i = window.find(self.format.start)
            if i < 0:
                self._tail = window[len(window) - len(self.format.start) + 1 :]
                return
            self.inside, window, thinking = True, window[i + len(self.format.start) :], False
        else:
            thinking = True  # a token of thinking, unless it ends it (a marker's is not counted)
        if self.format.end in window:
            self.over, self._forcing = True, []
            return
        self.num_tokens += thinking
        self._tail = window[len(window) - len(self.format.end) + 1 :]
        self._check()

    def _check(self) -> None:
        spent = self.budget is not None and self.num_tokens >= self.budget
        if spent and self.inside and not self.over and not self._forced_any:
            self._forcing, self._forced_any = list(self._end_ids), True
