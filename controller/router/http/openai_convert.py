"""OpenAI's request bodies -> `GenerateRequest`, the worker's field paths -> OpenAI's parameter
names, and `GenerateResponse`s -> OpenAI's response and chunk objects. The HTTP side's one
protobuf boundary: the request then goes through the same router (and the same worker checks) as
a gRPC one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from intentserve.common.ids import new_request_id
from intentserve.controller.router.http.openai_schema import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ToolDefinition,
)
from intentserve.controller.router.request_metrics import FINISH_REASONS
from intentserve.v1 import inference_pb2

# The worker names a bad field by its GenerateRequest path; the client named it this way.
PARAMS = {
    "prompt": "prompt",
    "prompt_token_ids": "prompt",
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.top_k": "top_k",
    "sampling.seed": "seed",
    "stop.max_tokens": "max_tokens",
    "stop.stop": "stop",
    "stop.ignore_eos": "ignore_eos",
    "stop.stop_token_ids": "stop_token_ids",
    "stop.min_tokens": "min_tokens",
    "sampling.presence_penalty": "presence_penalty",
    "sampling.frequency_penalty": "frequency_penalty",
    "sampling.repetition_penalty": "repetition_penalty",
    "sampling.min_p": "min_p",
    "sampling.logit_bias": "logit_bias",
    "sampling.logprobs": "logprobs",
    "chat_template_kwargs": "chat_template_kwargs",
    "tools": "tools",
    "tool_choice": "tool_choice",
    "tool_choice_function": "tool_choice",
    "n": "n",  # past the worker's maxNumSeqs
    "tokens": "tokens",  # /detokenize
}
TOOL_CHOICES = {
    None: inference_pb2.TOOL_CHOICE_UNSPECIFIED,
    "auto": inference_pb2.TOOL_CHOICE_AUTO,
    "none": inference_pb2.TOOL_CHOICE_NONE,
    "required": inference_pb2.TOOL_CHOICE_REQUIRED,
}
# OpenAI's newer name for the system turn.
ROLE_ALIASES = {"developer": "system"}


def _generate_request(
    body: CompletionRequest | ChatCompletionRequest, max_tokens: int | None, logprobs: int | None
):
    sampling = inference_pb2.SamplingParams(
        temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        top_k=max(body.top_k or 0, 0),  # -1 (vLLM's "off") is 0 here
        top_p=body.top_p or 0.0,  # 0 on the wire means "not set"
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty or 0.0,  # 0 on the wire means "not set"
        min_p=body.min_p,
        logit_bias=body.token_bias,
    )
    if body.seed is not None:
        sampling.seed = body.seed
    if logprobs is not None:
        sampling.logprobs = logprobs
    stop = inference_pb2.StopConditions(
        stop=body.stop_strings,
        ignore_eos=body.ignore_eos,
        stop_token_ids=body.stop_token_ids or [],
        min_tokens=body.min_tokens,
    )
    if max_tokens is not None:
        stop.max_tokens = max_tokens
    constraint = _constraint(body)
    if constraint is not None:
        sampling.constraint.CopyFrom(constraint)
    # NOTE: the n choices are one request: the worker forks them from one prompt, seeding choice
    # i with seed + i (intentserve.common.choices).
    return inference_pb2.GenerateRequest(
        request_id=new_request_id(), sampling=sampling, stop=stop, n=body.n or 1
    )


def _constraint(
    body: CompletionRequest | ChatCompletionRequest,
) -> inference_pb2.OutputConstraint | None:
    """`structured_outputs` or `response_format` (the schema checked one of them at most)."""
    asked = body.structured_outputs
    if asked is not None:
        if asked.json_ is not None:
            schema = asked.json_
            return inference_pb2.OutputConstraint(
                json_schema=schema if isinstance(schema, str) else json.dumps(schema)
            )
        if asked.regex is not None:
            return inference_pb2.OutputConstraint(regex=asked.regex)
        if asked.choice is not None:
            return inference_pb2.OutputConstraint(
                choice=inference_pb2.Choices(choices=asked.choice)
            )
        return inference_pb2.OutputConstraint(json_object=True)
    form = body.response_format
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return inference_pb2.OutputConstraint(json_object=True)
    return inference_pb2.OutputConstraint(json_schema=json.dumps(form.json_schema.schema_))


def completion_request_to_pb(body: CompletionRequest) -> inference_pb2.GenerateRequest:
    max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    request = _generate_request(body, max_tokens, body.logprobs)
    if body.echo and (body.logprobs is not None or body.prompt_text is None):
        # NOTE: the prompt's tokens (and their scores) come from the worker.
        request.sampling.prompt_logprobs = body.logprobs or 0
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.extend(prompt)
    return request


def chat_request_to_pb(body: ChatCompletionRequest) -> inference_pb2.GenerateRequest:
    """Without a limit, the reply may fill what the model length leaves (as OpenAI's)."""
    limit = body.max_completion_tokens if body.max_completion_tokens is not None else None
    limit = body.max_tokens if limit is None else limit
    request = _generate_request(body, limit, body.num_logprobs)
    fill_conversation(request, body.messages, body.chat_template_kwargs, body.tools)
    if isinstance(body.tool_choice, dict):  # a named function (the schema checked its shape)
        request.tool_choice = inference_pb2.TOOL_CHOICE_FUNCTION
        request.tool_choice_function = body.tool_choice["function"]["name"]
    else:
        request.tool_choice = TOOL_CHOICES[body.tool_choice]
    # OpenAI's default is true; with required or a named function, false holds it to one call.
    request.parallel_tool_calls = bool(body.tools) and body.parallel_tool_calls is not False
    return request


def fill_conversation(
    request: inference_pb2.GenerateRequest | inference_pb2.TokenizeRequest,
    messages: list[ChatMessage],
    template_kwargs: dict[str, Any] | None,
    tools: list[ToolDefinition] | None,
) -> None:
    """A conversation's turns, template variables and tools, set on `request`."""
    request.messages.extend(
        inference_pb2.ChatMessage(
            role=ROLE_ALIASES.get(m.role, m.role),
            content=m.text,
            tool_calls=[
                inference_pb2.ToolCall(
                    id=c.id, name=c.function.name, arguments=c.function.arguments
                )
                for c in m.tool_calls or []
            ],
            tool_call_id=m.tool_call_id or "",
        )
        for m in messages
    )
    if template_kwargs is not None:
        request.chat_template_kwargs.update(template_kwargs)
    request.tools.extend(
        inference_pb2.Tool(
            name=t.function.name,
            description=t.function.description,
            parameters="" if t.function.parameters is None else json.dumps(t.function.parameters),
        )
        for t in tools or []
    )


def merged_usage(replies: list[Reply]) -> dict[str, int]:
    """One prompt, every choice's tokens (as OpenAI counts n choices)."""
    prompt = replies[0].num_prompt_tokens
    completion = sum(r.num_output_tokens for r in replies)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def merged_response(replies: list[Reply]) -> dict[str, Any]:
    """The whole reply of every choice (`stream: false`), in order of index."""
    responses = [r.response() for r in replies]
    body = responses[0]
    body["choices"] = [response["choices"][0] for response in responses]
    body["usage"] = merged_usage(replies)
    return body


def param_of(field_path: str, body) -> str | None:
    """The request parameter a worker's field path names; None when it names none. `body`: a
    completions, chat or /tokenize body (one with `messages` is read as a chat's)."""
    if field_path.startswith("sampling.constraint"):
        return getattr(body, "constraint_param", None)
    if getattr(body, "messages", None) is not None:
        if field_path in ("prompt", "prompt_token_ids", "chat") or field_path.startswith(
            "messages"
        ):
            if not field_path.startswith("messages["):
                return "messages"
            return field_path.replace(".arguments", ".function.arguments")
        if field_path == "stop.max_tokens":
            return body.max_tokens_param
        if field_path == "sampling.logprobs":
            return "top_logprobs"
        if field_path.startswith("tools["):
            return field_path.replace(".parameters", ".function.parameters").replace(
                ".name", ".function.name"
            )
    return PARAMS.get(field_path)


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
    with_logprobs: bool = False  # the request asked for them
    logprobs: list[inference_pb2.TokenLogprobs] = field(default_factory=list)
    echo: bool = False  # completions: the prompt goes before the completion
    echo_text: str | None = None  # the prompt's text; None: joined from its tokens
    num_logprob_chars: int = 0  # completions' text_offset of the next token
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's shape, in order
    num_streamed_calls: int = 0  # how many of tool_calls went out in chunks

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.request_id}"

    def add(self, response: inference_pb2.GenerateResponse) -> tuple[str, str | None]:
        """Take one response in; its text and (on the last) finish reason."""
        text = self._echoed(response) + response.text
        self.text.append(text)
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

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": self.num_output_tokens,
            "total_tokens": self.num_prompt_tokens + self.num_output_tokens,
        }

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
