"""Per-request sampling parameters, validated where they enter (errors name the field).

Every value accepted here can be served, and cheaply: the sampler is numerically safe for any
finite temperature, and the stop conditions are bounded so that checking them after each token
costs the engine loop little, whatever one request asks for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from intentserve.worker.engine.constraint import Constraint

from intentserve.common.field_errors import FieldError

# Bounds on what the engine checks after every token of a request (on the engine-loop thread).
MAX_STOP_STRINGS = 32
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024  # entries, as MAX_STOP_TOKEN_IDS: bounded work per step
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's limit)
SEED_LIMIT = 2**64  # a seed is an unsigned 64-bit integer (the proto's uint64)


class InvalidRequestError(FieldError):
    """A request field is out of range; `field` names it (maps to INVALID_ARGUMENT, with a
    google.rpc.BadRequest detail naming it)."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = 128  # None: as many as the model length leaves after the prompt
    temperature: float = 0.0  # 0 is greedy
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = field(default=())
    ignore_eos: bool = False
    presence_penalty: float = 0.0  # subtracted once from each generated token's logit
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # divides (multiplies) positive (negative) seen logits
    min_p: float = 0.0  # drop tokens below min_p x the likeliest's probability
    min_tokens: int = 0  # EOS and stop_token_ids cannot end the request before this many
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    logprobs: int | None = None  # None: none; k: the chosen token's and the k likeliest
    prompt_logprobs: int | None = None  # the same for each prompt token (no prefix-cache reuse)
    constraint: Constraint | None = None  # structured outputs: the grammar the output follows
    # A thinking model's tokens of thinking at most, its end marker then written by the worker
    # (reasoning.ThinkingBudget); 0: none. None: it thinks as long as it does.
    reasoning_budget: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens <= 0):
            raise InvalidRequestError(
                "max_tokens", f"must be a positive integer, got {self.max_tokens!r}"
            )
        if not isinstance(self.temperature, Real) or not 0.0 <= self.temperature < math.inf:
            raise InvalidRequestError(
                "temperature", f"must be finite and >= 0 (0 is greedy), got {self.temperature!r}"
            )
        if not _is_int(self.top_k) or self.top_k < 0:
            raise InvalidRequestError("top_k", f"must be >= 0 (0 disables it), got {self.top_k!r}")
        if not isinstance(self.top_p, Real) or not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT):
            raise InvalidRequestError(
                "seed", f"must be an integer in [0, 2**64), got {self.seed!r}"
            )
        budget = self.reasoning_budget
        if budget is not None and (not _is_int(budget) or budget < 0):
            raise InvalidRequestError(
                "reasoning_budget", f"must be an integer >= 0 (0: no thinking), got {budget!r}"
            )
        self._check_stop()
        self._check_logits_processing()

    def _check_logits_processing(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not isinstance(value, Real) or not -2.0 <= value <= 2.0:
                raise InvalidRequestError(name, f"must be in [-2, 2] (0 is off), got {value!r}")
        rp = self.repetition_penalty
        if not isinstance(rp, Real) or not 0.0 < rp < math.inf:
            raise InvalidRequestError(
                "repetition_penalty", f"must be finite and > 0 (1 is off), got {rp!r}"
            )
        if not isinstance(self.min_p, Real) or not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError("min_p", f"must be in [0, 1] (0 is off), got {self.min_p!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise InvalidRequestError("min_tokens", f"must be >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidRequestError(
                "min_tokens", f"{self.min_tokens} is more than max_tokens ({self.max_tokens})"
            )
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidRequestError(
                "logit_bias", f"{len(self.logit_bias)} entries; at most {MAX_LOGIT_BIAS}"
            )
        for token_id, bias in self.logit_bias:
            if not _is_int(token_id) or token_id < 0:
                raise InvalidRequestError("logit_bias", f"{token_id!r} is not a token id")
            if not isinstance(bias, Real) or not -100.0 <= bias <= 100.0:
                raise InvalidRequestError(
                    "logit_bias", f"token {token_id}: {bias!r} is outside [-100, 100]"
                )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise InvalidRequestError(name, f"must be in [0, {MAX_LOGPROBS}], got {value!r}")

    def _check_stop(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(
                "stop", f"{len(self.stop)} stop strings; at most {MAX_STOP_STRINGS}"
            )
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop", "stop strings must not be empty")
        longest = max((len(s) for s in self.stop), default=0)
        if longest > MAX_STOP_STRING_CHARS:
            raise InvalidRequestError(
                "stop", f"a stop string has {longest} characters; at most {MAX_STOP_STRING_CHARS}"
            )
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidRequestError(
                "stop_token_ids",
                f"{len(self.stop_token_ids)} ids; at most {MAX_STOP_TOKEN_IDS}",
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any penalty applies (each needs the request's token history)."""
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )

    @property
    def processes_logits(self) -> bool:
        """Whether the model's logits change before sampling (beyond temperature, top-k/p)."""
        return self.penalized or bool(self.logit_bias) or self.min_tokens > 0
