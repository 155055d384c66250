"""n > 1 (OpenAI's `n`, `GenerateRequest.n`): how choice i of a request is named and seeded, in
one place for the engine (which forks the choices from one prompt) and the worker's stream of
the request (which tags each choice's outputs with its index).

Choice 0 is the request itself, so it is what the same request with n=1 gives; a seeded
request's other choices take the seeds after its own, so that they differ.
"""

from __future__ import annotations

SEED_MODULUS = 2**64  # a seed is an unsigned 64-bit integer (the proto's uint64)


def choice_id(request_id: str, index: int) -> str:
    return request_id if index == 0 else f"{request_id}-{index}"


def choice_seed(seed: int, index: int) -> int:
    return (seed + index) % SEED_MODULUS
