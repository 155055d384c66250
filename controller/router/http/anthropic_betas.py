"""The `anthropic-beta` names the Messages API takes, and the operator's list of those it takes
without doing what they ask (`spec.controller.http.anthropicBetasIgnored`), each said back in the
reply's `x-intentserve-betas-ignored` header. Any other beta is refused naming the header
(anthropic_routes.check_headers)."""

from __future__ import annotations

import re
from collections.abc import Iterable

# Betas whose feature is served here as the API's own: prompt caching (cache_control), token
# counting and tool use; and betas that only let fields or turns through that are each honoured
# or refused by themselves: output_config.format (structured outputs), output_config.effort,
# system turns among the messages (the template renders them), thinking between tool calls (a
# thinking model's reply has one block of it, first, which that allows). Any other is refused:
# claude-code-20250219, for one, asks Anthropic's server for a mode of its own (tools it adds).
BETAS = (
    "prompt-caching-2024-07-31",
    "token-counting-2024-11-01",
    "tools-2024-04-04",
    "tools-2024-05-16",
    "structured-outputs-2025-12-15",
    "effort-2025-11-24",
    "mid-conversation-system-2026-04-07",
    "interleaved-thinking-2025-05-14",
)


IGNORED_HEADER = "x-intentserve-betas-ignored"
_BETA_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*")


def check_ignored_betas(names: Iterable[str]) -> tuple[str, ...]:
    """The operator's list of betas to take without doing what they ask: beta names, none of
    them one this server serves (that one is not ignored)."""
    names = tuple(names)
    for name in names:
        if not _BETA_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a beta name (lowercase letters, digits, - and .)")
        if name in BETAS:
            raise ValueError(f"{name!r} is served here; list only betas to ignore")
    return names
