"""Checkpoint 2, the loader fallback: the one place that decides whether falling back is allowed.

Loaders only know *whether* they are compatible; they hand the reason to this helper.
"""

from __future__ import annotations

from collections.abc import Callable

from intentserve.policy.config import PagedAttentionConfig
from intentserve.policy.errors import PagedAttentionRequiredError
from intentserve.policy.reasons import Reason


def disable_paged_attention(
    config: PagedAttentionConfig | None,
    reason: Reason,
    on_fallback: Callable[[Reason], None] | None = None,
) -> None:
    """Clear an optional config (recording why through `on_fallback`), or refuse a required one.

    Returns the config the caller must continue with, which is always "none": with
    `required=False` the paged cache is dropped; with `required=True` this raises
    `PagedAttentionRequiredError` naming the mode and the reason.
    """
    if config is None:
        return None
    if config.required:
        raise PagedAttentionRequiredError(reason, config.describe())
    if on_fallback is not None:
        on_fallback(reason)
    return None
