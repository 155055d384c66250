"""The request bodies of OpenAI's `/v1/completions` and `/v1/chat/completions`, as far as this
server honours them.

Only the JSON's shape is checked here (types, and the ranges the protobuf fields can hold); every
check of a value's meaning (temperature >= 0, top_p in (0, 1], max_tokens within the model length)
is the worker's, for HTTP and gRPC alike. A field this server cannot honour is refused naming it
when it asks for something (`n: 2`, `logprobs: 5`), never silently ignored; fields that change
nothing here (`user`, `metadata`, ...) are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

UInt32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
UInt64 = Annotated[int, Field(ge=0, le=2**64 - 1)]
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; send 0 for greedy


class UnsupportedField(ValueError):
    """A field asks for something this server does not do; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: UInt32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: UInt64 | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Not in OpenAI's API; vLLM's names. top_k -1 (vLLM's "off") is 0 here.
    top_k: Annotated[int, Field(ge=-1, le=2**32 - 1)] | None = None
    ignore_eos: bool = False
    # Asked for, these are refused (nothing here would honour them).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: Any = None
    best_of: int | None = None

    def unsupported(self) -> UnsupportedField | None:
        """The first field that asks for what this server does not do."""
        asks = {
            "n": (self.n != 1, "only n=1 is supported: send one request per choice"),
            "stream_options": (
                self.stream_options is not None and not self.stream,
                "only allowed when stream is true",
            ),
            "presence_penalty": (self.presence_penalty != 0, "penalties are not supported"),
            "frequency_penalty": (self.frequency_penalty != 0, "penalties are not supported"),
            "logit_bias": (bool(self.logit_bias), "logit_bias is not supported"),
            "logprobs": (self.logprobs not in (None, False, 0), "logprobs are not supported"),
            "best_of": (self.best_of not in (None, 1), "only best_of=1 is supported"),
            # NOTE: 0 on the wire means "not set" (1), the opposite of what was asked.
            "top_p": (
                self.top_p == 0,
                "0 is outside (0, 1]; allowed: (0, 1], or leave it out for 1 (for greedy "
                "decoding, send temperature 0)",
            ),
            **self._unsupported_here(),
        }
        return next((UnsupportedField(p, m) for p, (asked, m) in asks.items() if asked), None)

    def _unsupported_here(self) -> dict[str, tuple[bool, str]]:
        return {}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(_Request):
    # Text, token ids, or a batch of one of either.
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    suffix: str | None = None

    def _unsupported_here(self) -> dict[str, tuple[bool, str]]:
        batched = isinstance(self.prompt, list) and bool(self.prompt)
        batched = batched and not isinstance(self.prompt[0], int) and len(self.prompt) != 1
        return {
            "prompt": (batched, "one prompt per request: batched prompts are not supported"),
            "echo": (self.echo, "echo is not supported"),
            "suffix": (bool(self.suffix), "suffix (insertion) is not supported"),
        }


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[TextPart] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        """A part of another type (an image, audio) is refused naming it, before the union's
        other member reports that a list is not a string."""
        if isinstance(content, list):
            for i, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise ValueError(
                        f"part {i} is of type {kind!r}; allowed: text parts (this deployment "
                        "serves a text model)"
                    )
        return content

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage]
    max_completion_tokens: UInt32 | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def _unsupported_here(self) -> dict[str, tuple[bool, str]]:
        text_only = self.response_format is None or self.response_format.get("type") == "text"
        return {
            "top_logprobs": (self.top_logprobs is not None, "logprobs are not supported"),
            "tools": (bool(self.tools), "tools are not supported"),
            "response_format": (not text_only, "only the text response format is supported"),
        }

    @property
    def max_tokens_param(self) -> str:
        """The name the client gave its limit by (errors about it name that one)."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
