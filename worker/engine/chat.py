"""A conversation as a prompt: system, user and assistant turns, rendered through the model's chat
template so that the reply is the next assistant turn.

    Conversation.of([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    Conversation.user("Hi")  # what `chat=True` makes of a text prompt

Errors name the field as a client sends it: `messages`, `messages[1].role`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from intentserve.worker.engine.sampling import InvalidRequestError

ROLES = ("system", "user", "assistant")
# What render() itself gives the template; chat_template_kwargs cannot replace them.
RESERVED_TEMPLATE_VARIABLES = ("messages", "add_generation_prompt", "bos_token", "eos_token")


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class Conversation:
    """A non-empty list of turns, each with a role of `ROLES`, and extra variables for the chat
    template (`{"enable_thinking": False}` for Qwen3's)."""

    messages: tuple[ChatMessage, ...]
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.messages:
            raise InvalidRequestError("messages", "must not be empty")
        reserved = sorted(set(self.template_kwargs) & set(RESERVED_TEMPLATE_VARIABLES))
        if reserved:
            raise InvalidRequestError(
                "chat_template_kwargs",
                f"{', '.join(reserved)} cannot be set here; the server renders them",
            )
        for i, message in enumerate(self.messages):
            if message.role not in ROLES:
                raise InvalidRequestError(
                    f"messages[{i}].role",
                    f"{message.role!r} is not one of {', '.join(ROLES)}",
                )

    @classmethod
    def of(cls, messages: Sequence[Mapping[str, Any]]) -> Conversation:
        """From `{"role": ..., "content": ...}` dicts (the SDK's `LLM.chat`)."""
        if not messages or not all(
            isinstance(m, Mapping) and {"role", "content"} <= m.keys() for m in messages
        ):
            raise InvalidRequestError(
                "messages", 'must be a non-empty list of {"role": ..., "content": ...} dicts'
            )
        return cls(tuple(ChatMessage(str(m["role"]), str(m["content"])) for m in messages))

    @classmethod
    def user(cls, prompt: str) -> Conversation:
        return cls((ChatMessage("user", prompt),))

    def render(self, tokenizer, field: str = "messages") -> str:
        """The prompt text the model was trained on for this conversation, ending where the
        assistant's reply begins; a template that refuses it is an error naming `field`."""
        try:
            return tokenizer.apply_chat_template(
                [{"role": m.role, "content": m.content} for m in self.messages],
                **self.template_kwargs,
            )
        except ValueError as error:
            raise InvalidRequestError(field, str(error)) from None
