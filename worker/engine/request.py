"""Per-request state the engine keeps beside the scheduler's Sequence: text and stop strings;
what a request is given as (prepared) and gives back (its outputs, and their join)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from intentserve.worker.engine.reasoning import Phase, ReasoningSplitter, ThinkingBudget
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.engine.tool_calls import ToolCall, ToolCallParser
from intentserve.worker.model.tokenizer import IncrementalDecoder
from intentserve.worker.sched.sequence import FinishReason


@dataclass(frozen=True)
class PreparedRequest:
    """A request checked and tokenized, ready to be queued."""

    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    parses_tool_calls: bool = False  # the reply's tool calls are parsed out of its text
    # A chat reply of a thinking model: where it begins, relative to its reasoning (its text is
    # split into reasoning and reply); None: not split (not a chat, no thinking, or a grammar's).
    reasoning_phase: Phase | None = None


@dataclass(frozen=True)
class LogprobEntry:
    """A token, its text alone, and its log-probability."""

    token_id: int
    token: str
    logprob: float | None  # None for a prompt's first token, which nothing predicts


@dataclass(frozen=True)
class OutputLogprobs:
    """One generated token's log-probability and the likeliest at its position."""

    chosen: LogprobEntry
    top: tuple[LogprobEntry, ...]


@dataclass(frozen=True)
class RequestOutput:
    """One streaming delta: what a request produced since its previous output."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_text: str
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    error: str = ""  # why the request failed, when finish_reason is ERROR
    logprobs: tuple[OutputLogprobs, ...] = ()  # one per new token, when the request asked
    # One per prompt token, in a request's first output, when it asked.
    prompt_logprobs: tuple[OutputLogprobs, ...] = ()
    # With tools: the calls completed since the previous output (new_text holds what is no call).
    tool_calls: tuple[ToolCall, ...] = ()
    index: int = 0  # the choice's, among its request's n (Engine.add_choices)
    stop_string: str = ""  # finished by one of the request's stop strings: that one
    new_reasoning: str = ""  # a thinking model's thinking since the previous output (no markers)
    num_reasoning_tokens: int = 0  # of num_output_tokens, those of thinking so far


def joined(deltas: Seq[RequestOutput]) -> RequestOutput:
    """One request's deltas as one finished output (`Engine.generate`): every token, text,
    score and call in order, the prompt's scores from the first, the end from the last."""
    last = deltas[-1]
    return RequestOutput(
        last.request_id,
        tuple(t for d in deltas for t in d.new_token_ids),
        "".join(d.new_text for d in deltas),
        True,
        last.finish_reason,
        last.num_prompt_tokens,
        last.num_output_tokens,
        last.error,
        tuple(lp for d in deltas for lp in d.logprobs),
        next((d.prompt_logprobs for d in deltas if d.prompt_logprobs), ()),
        tuple(c for d in deltas for c in d.tool_calls),
        stop_string=last.stop_string,
        new_reasoning="".join(d.new_reasoning for d in deltas),
        num_reasoning_tokens=last.num_reasoning_tokens,
    )


class RequestState:
    """Detokenizes as tokens arrive and holds back text that could still begin a stop string
    (and, with a tool-call parser, a tool call); with a reasoning splitter, a thinking model's
    reply is split into its thinking and its text, and with a budget, its thinking is counted
    (and ended at the budget)."""

    def __init__(
        self,
        request_id: str,
        params: SamplingParams,
        decoder: IncrementalDecoder,
        tool_parser: ToolCallParser | None = None,
        index: int = 0,
        splitter: ReasoningSplitter | None = None,
        budget: ThinkingBudget | None = None,
    ) -> None:
        self.request_id = request_id
        self.index = index  # the choice's (Engine.add_choices)
        self.params = params
        self.decoder = decoder
        self.text = ""
        self.num_emitted_chars = 0
        self.num_emitted_tokens = 0
        self.stop_string = ""  # the stop string that ended it, once one has (none is empty)
        self.logprobs: list[OutputLogprobs] = []  # one per token, when the request asked
        self.prompt_scores: dict = {}  # prompt position -> TokenLogprobs, as prefill computes
        self._holdback = max((len(s) for s in params.stop), default=1) - 1
        self.tool_parser = tool_parser
        self.splitter = splitter
        self.budget = budget

    def on_token(self, token_id: int) -> bool:
        """Append one token's text; True when a stop string has now appeared."""
        piece = self.decoder.append([token_id])
        self.text += piece
        if self.budget is not None:
            self.budget.on_token(piece)
        if not self.params.stop:
            return False
        # NOTE: a stop string can only end inside the newest text plus the held-back tail.
        search_from = max(0, self.num_emitted_chars - self._holdback)
        hits = [(self.text.find(s, search_from), s) for s in self.params.stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if hits:
            end, self.stop_string = min(hits)
            self.text = self.text[:end]
        return bool(self.stop_string)

    def take_text(self, finished: bool) -> tuple[str, str, tuple[ToolCall, ...]]:
        """Reasoning and text not yet emitted and the tool calls completed; while running, keeps
        back what might start a stop string (or a tool call, or a reasoning marker)."""
        end = (
            len(self.text)
            if finished
            else max(self.num_emitted_chars, len(self.text) - self._holdback)
        )
        delta = self.text[self.num_emitted_chars : end]
        self.num_emitted_chars = end
        reasoning = ""
        if self.splitter is not None:
            reasoning, delta = self.splitter.feed(delta)
            if finished:
                held_reasoning, held_text = self.splitter.finish()
                reasoning, delta = reasoning + held_reasoning, delta + held_text
        if self.tool_parser is None:
            return reasoning, delta, ()
        return (reasoning, *self.tool_parser.feed(delta, final=finished))

    @property
    def called_tools(self) -> bool:
        return self.tool_parser is not None and self.tool_parser.num_calls > 0
