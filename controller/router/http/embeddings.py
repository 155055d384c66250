"""OpenAI's `POST /v1/embeddings`, served by an encoder deployment (an Embed on a READY worker
whose model embeds, tokenize_route.py):

    {"model", "input": str | [str] | [int] | [[int]], "encoding_format": "float" | "base64",
     "dimensions", "user"}
    -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
        "usage": {"prompt_tokens", "total_tokens"}}

Every field is honoured or refused naming it: `input` of texts or of token ids (nothing is cut
off: an input over the model's length is refused naming its index), `encoding_format` (base64:
the float32 values' little-endian bytes, as the official SDK decodes them; it asks for base64
unless told otherwise), `dimensions` (only the model's own length: MiniLM was not trained to be
truncated), `user` (a label for the client's own accounting: it asks for nothing). A decoder
deployment asked for embeddings is refused naming `model`, as an encoder asked for completions.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from intentserve.controller.router.http.errors import from_routing
from intentserve.controller.router.http.openai_schema import UInt32, UnsupportedField
from intentserve.controller.router.tokenize_route import TokenizeRoute
from intentserve.v1 import inference_pb2
from pydantic import BaseModel, ConfigDict, Field

PositiveInt = Annotated[int, Field(ge=1, le=2**32 - 1)]
# Inputs in one call, as OpenAI's own API bounds them (and the worker's engine, which refuses
# more by name too): refused here before any worker tokenizes one.
MAX_INPUTS = 2048


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[str] | list[UInt32] | list[list[UInt32]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | None = None
    user: str | None = None  # a label: asks for nothing

    def unsupported(self) -> UnsupportedField | None:
        if isinstance(self.input, list) and not self.input:
            return UnsupportedField("input", "an empty list; allowed: at least one input")
        many = isinstance(self.input, list) and not isinstance(self.input[0], int)
        if many and len(self.input) > MAX_INPUTS:
            return UnsupportedField(
                "input", f"{len(self.input)} inputs; allowed: at most {MAX_INPUTS} a call"
            )
        return None

    def to_pb(self) -> inference_pb2.EmbedRequest:
        request = inference_pb2.EmbedRequest()
        given = self.input
        if isinstance(given, str):
            request.texts.append(given)
        elif all(isinstance(item, str) for item in given):
            request.texts.extend(given)
        elif all(isinstance(item, int) for item in given):
            request.token_inputs.add(ids=given)
        else:
            for ids in given:
                request.token_inputs.add(ids=ids)
        if self.dimensions is not None:
            request.dimensions = self.dimensions
        return request


def field_name(path: str) -> str | None:
    """The body's name of the worker's EmbedRequest field path (`texts[2]` is `input[2]`)."""
    for field in ("texts", "token_inputs"):
        if path == field or path.startswith(f"{field}["):
            return "input" + path.removeprefix(field)
    return path if path == "dimensions" else None


def encode(values: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return values
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


def add_embeddings_route(
    app: FastAPI,
    route: TokenizeRoute,
    parse: Callable[[Request, type[BaseModel]], Awaitable[Any]],
) -> None:
    """`parse`: the app's (key, body shape, refused fields, model), as for the other routes."""

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict:
        body = await parse(request, EmbeddingsRequest)
        try:
            reply = await route.embed(body.to_pb(), None)
        except Exception as error:
            raise from_routing(error, body, field_name) from None
        return {
            "object": "list",
            "data": [
                {
                    "object": "embedding",
                    "index": index,
                    "embedding": encode(list(e.values), body.encoding_format),
                }
                for index, e in enumerate(reply.embeddings)
            ],
            "model": body.model,
            "usage": {
                "prompt_tokens": reply.num_prompt_tokens,
                "total_tokens": reply.num_prompt_tokens,
            },
        }
