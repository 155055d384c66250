"""An encoder model served for embeddings: the worker's engine when the checkpoint is an
encoder (BERT family) rather than a decoder.

It has no KV cache and no generation loop: an Embed call tokenizes its inputs, refuses any
over the model's length by name, and runs the batch through the encoder on the calling server
thread, one call at a time (the encoder's matmuls use every core; two at once would only share
them). Its realized report says so: no cache, task "embed", the vectors' length; the policy's
paged-attention decision is applied as for any model (`auto` falls back naming
`model_has_no_kv_cache`, `on` is refused before the model is built).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from intentserve.policy import (
    BackendKind,
    CacheKind,
    PagedAttentionConfig,
    RealizedCache,
    Reason,
    Resolution,
    SchedulerKind,
    WeightFormat,
)
from intentserve.worker.engine.policy_apply import apply_resolution
from intentserve.worker.engine.realized import RealizedReport
from intentserve.worker.engine.sampling import InvalidRequestError
from intentserve.worker.model.bert import Encoder, InputTooLong
from intentserve.worker.model.loaded import LoadedModel

EMBED = "embed"
# Inputs one Embed call may carry (OpenAI's embeddings API takes as many).
MAX_INPUTS = 2048
# Embed calls a worker runs at once; the rest are refused RESOURCE_EXHAUSTED, never queued
# unseen (the router asks another worker or the client retries).
MAX_CALLS = 8


class WrongTaskError(RuntimeError):
    """A call the worker's model cannot serve: Generate on an encoder, Embed on a decoder
    (FAILED_PRECONDITION, naming the task)."""


@dataclass(frozen=True)
class Embedded:
    vectors: torch.Tensor  # [inputs, dim] float32
    num_tokens: tuple[int, ...]  # tokens each input took


class EncoderEngine:
    task = EMBED

    def __init__(self, encoder: Encoder, realized: RealizedReport) -> None:
        self.encoder = encoder
        self.realized = realized
        self.max_model_len = encoder.max_tokens
        self._lock = threading.Lock()  # one batch through the encoder at a time

    @property
    def dim(self) -> int:
        return self.encoder.dim

    def embed(
        self,
        texts: list[str] | None = None,
        token_inputs: list[list[int]] | None = None,
        dimensions: int | None = None,
    ) -> Embedded:
        """The vectors of `texts` or `token_inputs` (exactly one of them), in their order.
        InvalidRequestError names the field: an empty or over-long input, an id outside the
        vocabulary, too many inputs, or `dimensions` (this model cannot truncate its vectors:
        only its own length is accepted)."""
        if dimensions is not None and dimensions != self.dim:
            raise InvalidRequestError(
                "dimensions",
                f"{dimensions}: this model's vectors have {self.dim} values and it was not "
                f"trained to be truncated; allowed: {self.dim} or unset",
            )
        field, ids = self._token_ids(texts, token_inputs)
        try:
            with self._lock:
                vectors = self.encoder.embed(ids)
        except InputTooLong as error:
            raise InvalidRequestError(
                f"{field}[{error.index}]",
                f"{error.num_tokens} tokens; this model takes at most {error.max_tokens} "
                "tokens an input (nothing is cut off: split the text)",
            ) from None
        return Embedded(vectors, tuple(len(i) for i in ids))

    def _token_ids(
        self, texts: list[str] | None, token_inputs: list[list[int]] | None
    ) -> tuple[str, list[list[int]]]:
        if bool(texts) == bool(token_inputs):
            raise InvalidRequestError(
                "texts", "give exactly one of texts and token_inputs, with at least one input"
            )
        field = "texts" if texts else "token_inputs"
        inputs = texts or token_inputs or []
        if len(inputs) > MAX_INPUTS:
            raise InvalidRequestError(
                field, f"{len(inputs)} inputs; allowed: at most {MAX_INPUTS} a call"
            )
        for index, item in enumerate(inputs):
            if not item:
                raise InvalidRequestError(f"{field}[{index}]", "empty; allowed: a non-empty input")
        if texts:
            return field, self.encoder.tokenize(list(texts))
        vocab = self.encoder.vocab_size
        for index, item in enumerate(inputs):
            bad = next((t for t in item if t >= vocab), None)
            if bad is not None:
                raise InvalidRequestError(
                    f"{field}[{index}]",
                    f"token id {bad} is outside the vocabulary; allowed: 0 to {vocab - 1}",
                )
        return field, [list(item) for item in inputs]

    def tokenize(self, text: str) -> list[int]:
        return self.encoder.tokenize([text])[0]

    def detokenize(self, ids: list[int]) -> str:
        vocab = self.encoder.vocab_size
        bad = next((t for t in ids if t >= vocab), None)
        if bad is not None:
            raise InvalidRequestError(
                "tokens", f"token id {bad} is outside the vocabulary; allowed: 0 to {vocab - 1}"
            )
        return self.encoder.detokenize(ids)


def build_encoder_engine(
    paged: PagedAttentionConfig | None, resolution: Resolution, loaded: LoadedModel, model: str
) -> EncoderEngine:
    """The encoder of `loaded` (an encoder checkpoint's facts), with the paged-attention decision
    applied as for a decoder: `auto` records why there is no cache, `on` never gets here (the
    policy refuses it: the model has no KV cache)."""
    reasons: list[Reason] = []
    apply_resolution(paged, resolution, reasons.append)
    encoder = Encoder.load(loaded.source_path)
    cache = RealizedCache(
        kind=CacheKind.NONE,
        backend=BackendKind.CONTIGUOUS,
        max_num_seqs=MAX_CALLS,
        # NOTE: "default": the policy's word for the scheduler of a model without a paged cache;
        # here it is the worker's bound on Embed calls at once.
        scheduler=SchedulerKind.DEFAULT,
        fallback_reasons=tuple(reasons),
        dtype=str(encoder.dtype).removeprefix("torch."),
        max_model_len=encoder.max_tokens,
        weight_format=WeightFormat.DEQUANTIZED,
        weight_bytes=encoder.weight_bytes,
        task=EMBED,
        embedding_dim=encoder.dim,
    )
    return EncoderEngine(encoder, RealizedReport(cache=cache, model=model))
