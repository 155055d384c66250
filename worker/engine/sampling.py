"""Per-request sampling parameters, validated where they enter (errors name the field)."""

from __future__ import annotations

from dataclasses import dataclass, field


class InvalidRequestError(ValueError):
    """A request field is out of range; `field` names it (maps to INVALID_ARGUMENT)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


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
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or self.max_tokens <= 0
        ):
            raise InvalidRequestError(
                "max_tokens", f"must be a positive integer, got {self.max_tokens!r}"
            )
        if not self.temperature >= 0.0:
            raise InvalidRequestError("temperature", f"must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError("top_k", f"must be >= 0 (0 disables it), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop", "stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
