"""The worker's side of checkpoint 2: every decision that disables a feature goes through the
shared fallback helper, which alone decides whether falling back is allowed."""

from __future__ import annotations

from collections.abc import Callable

from intentserve.policy import (
    Feature,
    PagedAttentionConfig,
    PagedAttentionRequiredError,
    Reason,
    ReasonCode,
    Resolution,
    disable_paged_attention,
)


def apply_resolution(
    config: PagedAttentionConfig | None, resolution: Resolution, record: Callable[[Reason], None]
) -> PagedAttentionConfig | None:
    """The config to build with (None: no paged cache); raises for a required feature that the
    resolution could not enable, naming the setting and the reason."""
    if resolution.backend.rejection is not None:
        assert config is not None  # an explicit backend only exists inside a paged config
        raise PagedAttentionRequiredError(
            resolution.backend.rejection,
            f"attention_backend: {config.backend.value}",
            subject="The attention backend",
        )
    for decision in resolution.decisions:
        if decision.enabled or decision.reason.code is ReasonCode.MODE_OFF:
            continue
        if decision.feature is Feature.PAGED_ATTENTION:
            config = disable_paged_attention(config, decision.reason, record)
        elif not decision.accepted:
            raise PagedAttentionRequiredError(
                decision.reason, f"{decision.feature.value}: on", subject="Prefix caching"
            )
        else:
            record(decision.reason)
    if resolution.backend.reason is not None:
        record(resolution.backend.reason)
    return config
