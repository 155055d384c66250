"""How big a request a router forwards, checked before any worker renders or tokenizes it (those
cost the worker's CPU, beside every other stream it serves). Each refusal is RequestTooLarge,
INVALID_ARGUMENT naming the field (the HTTP API's `param`) and what is allowed, checked cheapest
first:

- bytes: MAX_REQUEST_BYTES (streaming.py) serialized, the largest field named. On a worker's
  multiplexed call a message over its receive limit would end every request on the call.
- turns: MAX_MESSAGES `messages`; tools: MAX_TOOLS `tools`. Each is rendered through the chat
  template; both are OpenAI's own limits on its chat completions.
- nesting: MAX_JSON_DEPTH (nesting.py) in every field that holds JSON.
- characters: a prompt, or a conversation (its turns, tool calls, tools and template
  variables), of more than max_model_len x MAX_TOKEN_CHARS characters cannot fit the model: no
  token is longer than MAX_TOKEN_CHARS characters, so it would be more than max_model_len
  tokens. Only once a READY worker has reported its max_model_len (the largest of theirs).
- a Detokenize's ids: at most max_model_len (the longest sequence the model serves).
"""

from __future__ import annotations

from google.protobuf.message import Message
from intentserve.common.streaming import MAX_REQUEST_BYTES
from intentserve.controller.errors import RequestTooLarge
from intentserve.controller.router.nesting import (
    MAX_JSON_DEPTH,
    struct_chars,
    struct_over,
    text_over,
)
from intentserve.v1 import inference_pb2

MAX_MESSAGES = 2048  # OpenAI's limit on a chat's `messages`
MAX_TOOLS = 128  # OpenAI's limit on a chat's `tools`
# At least the longest token of every vocabulary served here, with room: SmolLM2's is 81
# characters (a newline and 80 spaces), Gemma 3's 31. A prompt of natural text averages about 4.
MAX_TOKEN_CHARS = 128

# What a conversation's lists may hold: field -> (at most, what its items are called).
COUNT_BOUNDS = {"messages": (MAX_MESSAGES, "turns"), "tools": (MAX_TOOLS, "tools")}

Conversational = inference_pb2.GenerateRequest | inference_pb2.TokenizeRequest


def over_count(field: str, count: int) -> str | None:
    """Why `count` items are too many for a list of COUNT_BOUNDS (None: they are not); the HTTP
    API asks it of a body's list before reading its items."""
    bound, what = COUNT_BOUNDS[field]
    return f"{count} {what}; allowed: at most {bound} {what}" if count > bound else None


def check_request(request: Conversational, max_model_len: int) -> None:
    """RequestTooLarge when a Generate or Tokenize request is over one of the bounds above;
    `max_model_len`: the largest a READY worker reported (0: none known, characters unchecked)."""
    check_size(request)
    for field in COUNT_BOUNDS:
        problem = over_count(field, len(getattr(request, field)))
        if problem is not None:
            raise RequestTooLarge(field, problem)
    _check_nesting(request)
    if max_model_len:
        _check_chars(request, max_model_len)


def check_detokenize(request: inference_pb2.DetokenizeRequest, max_model_len: int) -> None:
    """RequestTooLarge when a Detokenize request is over its bytes, or has more ids than the
    longest sequence the model serves (0: none known, unchecked)."""
    check_size(request)
    count = len(request.tokens)
    if max_model_len and count > max_model_len:
        raise RequestTooLarge(
            "tokens",
            f"{count} ids; allowed: at most {max_model_len} ids (max_model_len, the longest "
            "sequence this deployment serves)",
        )


def check_size(request: Message) -> None:
    """RequestTooLarge, naming the request's largest field, when it is over MAX_REQUEST_BYTES:
    on a worker's multiplexed call a message over its receive limit would end the call, and
    every other request on it with it (a Tokenize's too takes no more)."""
    size = request.ByteSize()
    if size > MAX_REQUEST_BYTES:
        raise RequestTooLarge(
            _largest_field(request),
            f"the request is {size} bytes; allowed: at most {MAX_REQUEST_BYTES} bytes in all "
            "(prompt, messages, stop strings and the rest)",
        )


def _check_nesting(request: Conversational) -> None:
    texts = [
        (f"messages[{i}].tool_calls[{j}].arguments", call.arguments)
        for i, message in enumerate(request.messages)
        for j, call in enumerate(message.tool_calls)
    ]
    texts += [(f"tools[{i}].parameters", tool.parameters) for i, tool in enumerate(request.tools)]
    if isinstance(request, inference_pb2.GenerateRequest):
        texts.append(("sampling.constraint.json_schema", request.sampling.constraint.json_schema))
    deep = [field for field, text in texts if text_over(text)]
    if request.HasField("chat_template_kwargs") and struct_over(request.chat_template_kwargs):
        deep.append("chat_template_kwargs")
    if deep:
        raise RequestTooLarge(
            deep[0], f"nested too deep; allowed: at most {MAX_JSON_DEPTH} levels of JSON"
        )


def _check_chars(request: Conversational, max_model_len: int) -> None:
    chars = {
        "prompt": len(request.prompt),
        "messages": sum(
            len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
            for m in request.messages
        ),
        "tools": sum(len(t.name) + len(t.description) + len(t.parameters) for t in request.tools),
        "chat_template_kwargs": struct_chars(request.chat_template_kwargs),
    }
    num_chars, limit = sum(chars.values()), max_model_len * MAX_TOKEN_CHARS
    if num_chars > limit:
        raise RequestTooLarge(
            max(chars, key=chars.__getitem__),
            f"{num_chars} characters in all (prompt, turns, tools, template variables) cannot "
            f"fit {max_model_len} tokens (max_model_len); allowed: at most {limit} characters "
            f"({MAX_TOKEN_CHARS} a token, more than any token of the model has)",
        )


def _largest_field(message, prefix: str = "") -> str:
    """The dotted name of the set field that takes the most bytes (into singular messages)."""
    sizes = []
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        if field.message_type is not None:
            size = sum(v.ByteSize() for v in values)
        else:  # text by its length (no copy of a 50 MB prompt to rank it); a number up to 10
            size = sum(len(v) if isinstance(v, str | bytes) else 10 for v in values)
        inner = value if field.message_type is not None and not field.is_repeated else None
        sizes.append((size, field, inner))
    _, field, inner = max(sizes, key=lambda s: s[0])
    name = prefix + field.name
    return _largest_field(inner, name + ".") if inner is not None and inner.ListFields() else name
