"""`GenerateResponse`s -> OpenAI's response and chunk objects: one choice's streamed responses
collected as a `Reply`, and the n choices of one request merged into one response.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from intentserve.controller.router.request_metrics import FINISH_REASONS
from intentserve.v1 import inference_pb2


def merged_usage(replies: list[Reply]) -> dict[str, Any]:
    """One prompt, every choice's tokens (as OpenAI counts n choices)."""
    prompt = replies[0].num_prompt_tokens
    completion = sum(r.num_output_tokens for r in replies)
    return _usage(prompt, completion, sum(r.num_reasoning_tokens for r in replies))


def _usage(prompt: int, completion: int, reasoning: int) -> dict[str, Any]:
    """OpenAI's usage; a thinking model's thinking tokens (of completion_tokens) in its
    details, where there were any."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if reasoning:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage


def merged_response(replies: list[Reply]) -> dict[str, Any]:
    """The whole reply of every choice (`stream: false`), in order of index."""
    responses = [r.response() for r in replies]
    body = responses[0]
    body["choices"] = [response["choices"][0] for response in responses]
    body["usage"] = merged_usage(replies)
    return body


@dataclass
class Reply:
    """One choice's streamed responses, collected into OpenAI's objects."""

    chat: bool
    model: str
    request_id: str
    index: int = 0  # the choice's (n > 1)
    created: int = field(default_factory=lambda: int(time.time()))
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_reasoning_tokens: int = 0  # of num_output_tokens, a thinking model's thinking
    with_logprobs: bool = False  # the request asked for them
    logprobs: list[inference_pb2.TokenLogprobs] = field(default_factory=list)
    echo: bool = False  # completions: the prompt goes before the completion
    echo_text: str | None = None  # the prompt's text; None: joined from its tokens
    num_logprob_chars: int = 0  # completions' text_offset of the next token
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's shape, in order
    num_streamed_calls: int = 0  # how many of tool_calls went out in chunks
    # A thinking model's thinking (chat): all of it, and what the next chunk has yet to send.
    reasoning: list[str] = field(default_factory=list)
    unsent_reasoning: str = ""

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.request_id}"

    def add(self, response: inference_pb2.GenerateResponse) -> tuple[str, str | None]:
        """Take one response in; its text and (on the last) finish reason."""
        text = self._echoed(response) + response.text
        self.text.append(text)
        if response.reasoning:
            self.reasoning.append(response.reasoning)
            self.unsent_reasoning += response.reasoning
        self.logprobs.extend(response.logprobs)
        self.tool_calls.extend(
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in response.tool_calls
        )
        self.num_output_tokens = response.num_output_tokens
        self.num_reasoning_tokens = response.num_reasoning_tokens
        finish = FINISH_REASONS.get(response.finish_reason) or None
        if finish is not None:
            self.finish_reason, self.num_prompt_tokens = finish, response.num_prompt_tokens
        return text, finish

    def _echoed(self, response: inference_pb2.GenerateResponse) -> str:
        """With echo, on the first response: the prompt (its tokens' scores go first too)."""
        if not self.echo:
            return ""
        self.echo = False
        self.logprobs.extend(response.prompt_logprobs)
        if self.echo_text is not None:
            return self.echo_text
        return "".join(e.chosen.token for e in response.prompt_logprobs)

    def usage(self) -> dict[str, Any]:
        return _usage(self.num_prompt_tokens, self.num_output_tokens, self.num_reasoning_tokens)

    def _logprobs(self, entries) -> dict[str, Any] | None:
        """OpenAI's logprobs object for `entries` (chat's or completions' shape)."""
        if not self.with_logprobs:
            return None
        if self.chat:

            def entry(e: inference_pb2.LogprobEntry) -> dict[str, Any]:
                return {"token": e.token, "logprob": e.logprob, "bytes": list(e.token.encode())}

            content = [
                {**entry(t.chosen), "top_logprobs": [entry(e) for e in t.top]} for t in entries
            ]
            return {"content": content, "refusal": None}
        offsets = []
        for t in entries:
            offsets.append(self.num_logprob_chars)
            self.num_logprob_chars += len(t.chosen.token)
        # NOTE: a prompt's first token (echo) has no score: null, as OpenAI's.
        scored = [t if t.chosen.HasField("logprob") else None for t in entries]
        return {
            "tokens": [t.chosen.token for t in entries],
            "token_logprobs": [t and t.chosen.logprob for t in scored],
            "top_logprobs": [t and {e.token: e.logprob for e in t.top} for t in scored],
            "text_offset": offsets,
        }

    def _object(
        self, kind: str, choice: dict[str, Any], logprobs=(), **extra: Any
    ) -> dict[str, Any]:
        choice = {"index": self.index, **choice, "logprobs": self._logprobs(logprobs)}
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            **extra,
        }

    @property
    def has_unsent_calls(self) -> bool:
        return self.num_streamed_calls < len(self.tool_calls)

    def response(self) -> dict[str, Any]:
        """The whole reply (`stream: false`); with tool calls and no other text, content null."""
        text = "".join(self.text)
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.reasoning:  # vLLM's name for it, which OpenAI's SDKs keep as an extra
                message["reasoning_content"] = "".join(self.reasoning)
            if self.tool_calls:
                message.update(content=text or None, tool_calls=self.tool_calls)
            choice = {"message": message, "finish_reason": self.finish_reason}
            return self._object("chat.completion", choice, self.logprobs, usage=self.usage())
        choice = {"text": text, "finish_reason": self.finish_reason}
        return self._object("text_completion", choice, self.logprobs, usage=self.usage())

    def chunk(self, text: str, finish: str | None, *, first: bool = False, **extra: Any):
        """One `stream: true` chunk; the chat stream's first says who speaks. It carries the
        logprobs of the tokens taken in since the previous chunk, and the tool calls."""
        logprobs, self.logprobs = self.logprobs, []
        if self.chat:
            delta: dict[str, Any] = (
                {"role": "assistant", "content": text} if first else {"content": text}
            )
            if finish is not None and not text:
                delta = {}
            if self.unsent_reasoning:
                delta["reasoning_content"], self.unsent_reasoning = self.unsent_reasoning, ""
                if not text:
                    delta.pop("content", None)
            if self.has_unsent_calls:
                # NOTE: each call goes out whole, in one delta, with its index in the reply.
                start, self.num_streamed_calls = self.num_streamed_calls, len(self.tool_calls)
                calls = self.tool_calls[start:]
                delta["tool_calls"] = [{"index": start + i, **c} for i, c in enumerate(calls)]
                if not text:
                    delta.pop("content", None)
            choice = {"delta": delta, "finish_reason": finish}
            return self._object("chat.completion.chunk", choice, logprobs, **extra)
        choice = {"text": text, "finish_reason": finish}
        return self._object("text_completion", choice, logprobs, **extra)

    def usage_chunk(self) -> dict[str, Any]:
        """`stream_options.include_usage`: the last chunk, with no choice and the usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self.usage(),
        }
