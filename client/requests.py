"""A generation request built from Python values, each checked to fit its field."""

from __future__ import annotations

import math

from intentserve.v1 import inference_pb2

_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1


class RequestValueError(ValueError):
    """A value a request's field cannot carry; the message names the field and what it allows."""


def _check_fits(field: str, value: int, largest: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= largest:
        raise RequestValueError(f"{field}: {value!r}; allowed: an integer from 0 to {largest}")


def check_timeout(timeout_s: float | None) -> None:
    """A request's `timeout_s`: None (no deadline) or finite seconds > 0; else RequestValueError
    naming it (a wait of none or of -1 s is no deadline, and would read as one that passed)."""
    if timeout_s is None:
        return
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not (math.isfinite(timeout_s) and timeout_s > 0)
    ):
        raise RequestValueError(
            f"timeout_s: {timeout_s!r}; allowed: finite seconds > 0, or None for no deadline"
        )


def generate_request(
    prompt: str,
    *,
    chat: bool,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    stop: list[str] | None,
    ignore_eos: bool,
    n: int = 1,
) -> inference_pb2.GenerateRequest:
    """The request, or RequestValueError naming a value its field cannot carry (what the values
    mean, e.g. max_tokens within the model length, is the worker's check)."""
    _check_fits("max_tokens", max_tokens, _UINT32_MAX)
    _check_fits("top_k", top_k, _UINT32_MAX)
    _check_fits("n", n, _UINT32_MAX)
    if seed is not None:
        _check_fits("seed", seed, _UINT64_MAX)
    sampling = inference_pb2.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    if seed is not None:
        sampling.seed = seed
    return inference_pb2.GenerateRequest(
        prompt=prompt,
        n=n,
        chat=chat,
        sampling=sampling,
        stop=inference_pb2.StopConditions(
            max_tokens=max_tokens, stop=stop or [], ignore_eos=ignore_eos
        ),
    )
