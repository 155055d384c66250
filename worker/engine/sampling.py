"""Per-request sampling parameters, validated where they enter (errors name the field).

Every value accepted here can be served, and cheaply: the sampler is numerically safe for any
finite temperature, and the stop conditions are bounded so that checking them after each token
costs the engine loop little, whatever one request asks for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real

# Bounds on what the engine checks after every token of a request (on the engine-loop thread).
MAX_STOP_STRINGS = 32
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
SEED_LIMIT = 2**64  # a seed is an unsigned 64-bit integer (the proto's uint64)


class InvalidRequestError(ValueError):
    """A request field is out of range; `field` names it (maps to INVALID_ARGUMENT)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


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
        self._check_stop()

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
