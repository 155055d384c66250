"""The request bodies of OpenAI's `/v1/completions` and `/v1/chat/completions` (with vLLM's
extra sampling fields), as far as this server honours them: the fields both share
(`OpenAIRequest`) and the completions body here, chat's body and its conversation in
`openai_chat_schema.py`.

Only the JSON's shape is checked here (types, and the ranges the protobuf fields can hold); every
check of a value's meaning (temperature >= 0, top_p in (0, 1], max_tokens within the model length)
is the worker's, for HTTP and gRPC alike. Nothing is accepted and dropped: a field this server
does not know is refused naming it (`extra="forbid"`), and a known field whose value asks for
what nothing here does (`echo: true` in chat, completions' `tool_choice: "required"`) is refused
naming it.
`user` and `safety_identifier` are labels for the client's own accounting: they ask for nothing
and pass.

Structured outputs: OpenAI's `response_format` (`text`, `json_object`, `json_schema`) and vLLM's
`structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`: its current name for the
`guided_*` fields it removed in v0.12, which are unknown here), one of the two per request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar

from intentserve.controller.router.http.structured import ResponseFormat, StructuredOutputs
from pydantic import BaseModel, ConfigDict, Field, field_validator

UInt32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
UInt64 = Annotated[int, Field(ge=0, le=2**64 - 1)]
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; send 0 for greedy
MAX_CHOICES = 16  # n: the most choices one body may ask for (a worker may allow fewer)


class UnsupportedField(ValueError):
    """A field asks for something this server does not do; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def first_asked(model: BaseModel, refusals: dict[str, tuple[Callable[[Any], bool], str]]):
    """The first (field, message) of `refusals` whose value asks for something."""
    for name, (asks, message) in refusals.items():
        value = getattr(model, name)
        if value is not None and asks(value):
            return name, message
    return None


TOOLS = "completions take no tools (tool calling is chat's)"
# Fields that ask for what nothing here does: (does this value ask for it?, why refused).
REFUSALS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: not 1 <= v <= MAX_CHOICES, f"allowed: 1 to {MAX_CHOICES} choices"),
    "tool_choice": (lambda v: v != "none", f"{TOOLS}; allowed: 'none'"),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class OpenAIRequest(BaseModel):
    """The fields both bodies share, and how a field that asks for what is not done is found."""

    model_config = ConfigDict(extra="forbid")
    refusals: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = REFUSALS

    model: str
    max_tokens: UInt32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: UInt64 | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # a label: asks for nothing
    # Not in OpenAI's API; vLLM's names. top_k -1 (vLLM's "off") is 0 here.
    top_k: Annotated[int, Field(ge=-1, le=2**32 - 1)] | None = None
    min_p: float = 0.0
    repetition_penalty: float | None = None
    min_tokens: UInt32 = 0
    stop_token_ids: list[UInt32] | None = None
    ignore_eos: bool = False
    n: int | None = None  # choices, forked from one prompt by the worker (REFUSALS bounds it)
    echo: bool | None = None  # completions: the prompt before the completion; chat: refused
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's
    # Only its neutral value passes (REFUSALS).
    tool_choice: str | dict[str, Any] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key in bias or {}:
            if not key.isdigit() or int(key) >= 2**32:
                raise ValueError(f"key {key!r} is not a token id (a non-negative integer)")
        return bias

    def unsupported(self) -> UnsupportedField | None:
        """The first field that asks for what this server does not do."""
        asks = {
            "stream_options": (
                self.stream_options is not None and not self.stream,
                "only allowed when stream is true",
            ),
            # NOTE: 0 on the wire means "not set" (1), the opposite of what was asked.
            "top_p": (
                self.top_p == 0,
                "0 is outside (0, 1]; allowed: (0, 1], or leave it out for 1 (for greedy "
                "decoding, send temperature 0)",
            ),
            "repetition_penalty": (
                self.repetition_penalty == 0,
                "0 is outside (0, inf); allowed: > 0 (1 is off)",
            ),
            **self._structured_problems(),
            **self._unsupported_here(),
        }
        first = next(((p, m) for p, (asked, m) in asks.items() if asked), None)
        first = first or first_asked(self, self.refusals)
        return None if first is None else UnsupportedField(*first)

    def _unsupported_here(self) -> dict[str, tuple[bool, str]]:
        return {}

    def _structured_problems(self) -> dict[str, tuple[bool, str]]:
        formatted = self.response_format is not None and self.response_format.type != "text"
        if formatted and self.structured_outputs is not None:
            return {"structured_outputs": (True, "give response_format or structured_outputs")}
        problems = {}
        if self.structured_outputs is not None:
            problems.update(self.structured_outputs.problems("structured_outputs"))
        if self.response_format is not None:
            problems.update(self.response_format.problems("response_format"))
        return problems

    @property
    def constraint_param(self) -> str:
        """The parameter the client asked for structured outputs by (errors name it)."""
        return "structured_outputs" if self.structured_outputs is not None else "response_format"

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def token_bias(self) -> dict[int, float]:
        return {int(k): v for k, v in (self.logit_bias or {}).items()}


class CompletionRequest(OpenAIRequest):
    refusals: ClassVar = {
        **REFUSALS,
        "best_of": (lambda v: v != 1, "only best_of=1 is supported"),
        "suffix": (bool, "suffix (insertion) is not supported"),
    }

    # Text, token ids, or a batch of one of either.
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: UInt32 | None = None
    best_of: int | None = None
    suffix: str | None = None

    @property
    def prompt_text(self) -> str | None:
        """The prompt as text (None: given as token ids)."""
        prompt = self.prompt[0] if isinstance(self.prompt, list) and self.prompt else self.prompt
        return prompt if isinstance(prompt, str) else None

    def _unsupported_here(self) -> dict[str, tuple[bool, str]]:
        batched = isinstance(self.prompt, list) and bool(self.prompt)
        batched = batched and not isinstance(self.prompt[0], int) and len(self.prompt) != 1
        return {"prompt": (batched, "one prompt per request: batched prompts are not supported")}
