"""vLLM's `/tokenize` and `/detokenize`, on a READY worker's tokenizer (tokenize_route.py):

    POST /tokenize    {"model", "prompt" | "messages" (+ "chat_template_kwargs", "tools"),
                       "add_special_tokens", "return_token_strs"}
                   -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize  {"model", "tokens"} -> {"prompt"}

The ids are those a completion (or a chat) of the same prompt is computed from. Keys and errors
as the OpenAI endpoints': a field no schema here knows is refused naming it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from intentserve.controller.router.http.errors import from_routing
from intentserve.controller.router.http.openai_chat_schema import (
    Messages,
    Tools,
    conversation_unsupported,
)
from intentserve.controller.router.http.openai_convert import fill_conversation
from intentserve.controller.router.http.openai_schema import UInt32, UnsupportedField
from intentserve.controller.router.tokenize_route import TokenizeRoute
from intentserve.v1 import inference_pb2
from pydantic import BaseModel, ConfigDict


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: str | None = None
    messages: Messages | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Tools | None = None
    add_special_tokens: bool | None = None  # None: as the checkpoint (and a completion) has it
    return_token_strs: bool = False

    def unsupported(self) -> UnsupportedField | None:
        if (self.prompt is None) == (self.messages is None):
            return UnsupportedField(
                "prompt" if self.messages is None else "messages",
                "give a prompt or messages (one of them)",
            )
        if self.messages is None:
            for name in ("chat_template_kwargs", "tools"):
                if getattr(self, name) is not None:
                    return UnsupportedField(name, "applies to messages, which were not given")
            return None
        return conversation_unsupported(self.messages, self.tools)

    def to_pb(self) -> inference_pb2.TokenizeRequest:
        request = inference_pb2.TokenizeRequest(
            prompt=self.prompt or "", return_token_strs=self.return_token_strs
        )
        if self.add_special_tokens is not None:
            request.add_special_tokens = self.add_special_tokens
        if self.messages is not None:
            fill_conversation(request, self.messages, self.chat_template_kwargs, self.tools)
        return request


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    tokens: list[UInt32]

    def unsupported(self) -> UnsupportedField | None:
        return None


def add_tokenize_routes(
    app: FastAPI,
    route: TokenizeRoute,
    parse: Callable[[Request, type[BaseModel]], Awaitable[Any]],
) -> None:
    """`parse`: the app's (key, body shape, refused fields, model), as for the OpenAI routes."""

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        body = await parse(request, TokenizeRequest)
        try:
            reply = await route.tokenize(body.to_pb(), None)
        except Exception as error:
            raise from_routing(error, body) from None
        return {
            "count": len(reply.tokens),
            "max_model_len": reply.max_model_len,
            "tokens": list(reply.tokens),
            "token_strs": list(reply.token_strs) if body.return_token_strs else None,
        }

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        body = await parse(request, DetokenizeRequest)
        try:
            reply = await route.detokenize(
                inference_pb2.DetokenizeRequest(tokens=body.tokens), None
            )
        except Exception as error:
            raise from_routing(error, body) from None
        return {"prompt": reply.prompt}
