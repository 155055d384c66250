"""OpenAI's request bodies -> `GenerateRequest`, and the worker's field paths -> OpenAI's
parameter names. The HTTP side's one protobuf boundary on the way in (`openai_reply.py` is the way
out): the request then goes through the same router (and the same worker checks) as a gRPC one.
"""

from __future__ import annotations

import json
from typing import Any

from intentserve.common.ids import new_request_id
from intentserve.controller.router.http.openai_chat_schema import (
    ChatCompletionRequest,
    ChatMessage,
    ToolDefinition,
)
from intentserve.controller.router.http.openai_schema import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    CompletionRequest,
)
from intentserve.controller.router.http.reasoning_effort import set_effort
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
    "reasoning_budget": "reasoning_effort",  # a model that does not think
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
        if asked.grammar is not None:
            return inference_pb2.OutputConstraint(grammar=asked.grammar)
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
    set_effort(request, body.reasoning_effort)
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


def param_of(field_path: str, body) -> str | None:
    """The request parameter a worker's field path names; None when it names none. `body`: a
    completions, chat or /tokenize body (one with `messages` is read as a chat's)."""
    if field_path == "sampling.constraint.grammar":
        return "structured_outputs.grammar"  # NOTE: only structured_outputs asks for one
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
