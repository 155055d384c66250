"""The whole intent resolved against one worker's capability."""

from __future__ import annotations

from dataclasses import dataclass

from intentserve.policy.capability import Capability, DeviceKind
from intentserve.policy.config import PagedAttentionConfig
from intentserve.policy.decide import (
    DEFAULT_AUTO_DEVICES,
    BackendChoice,
    Decision,
    choose_backend,
    decide_paged_attention,
    decide_prefix_caching,
)
from intentserve.policy.modes import WeightFormat
from intentserve.policy.reasons import Reason, ReasonCode
from intentserve.policy.weights import DEFAULT_WEIGHT_CHOICE, WeightChoice, choose_weight_format


@dataclass(frozen=True)
class Resolution:
    paged_attention: Decision
    prefix_caching: Decision
    backend: BackendChoice
    weights: WeightChoice = DEFAULT_WEIGHT_CHOICE

    @property
    def decisions(self) -> tuple[Decision, ...]:
        return (self.paged_attention, self.prefix_caching)

    @property
    def accepted(self) -> bool:
        return self.rejection is None

    @property
    def rejection(self) -> Reason | None:
        """Why this worker cannot serve the policy; None when it can."""
        for decision in self.decisions:
            if not decision.accepted:
                return decision.reason
        return self.backend.rejection or self.weights.rejection

    @property
    def fallback_reasons(self) -> tuple[Reason, ...]:
        """Why an optional feature is not used here (the `auto` fallbacks), for the report."""
        reasons = tuple(
            d.reason
            for d in self.decisions
            if d.accepted and not d.enabled and d.reason.code is not ReasonCode.MODE_OFF
        )
        return reasons + ((self.backend.reason,) if self.backend.reason is not None else ())


def resolve(
    config: PagedAttentionConfig | None,
    capability: Capability,
    auto_devices: frozenset[DeviceKind] = DEFAULT_AUTO_DEVICES,
    weights: WeightFormat = WeightFormat.AUTO,
) -> Resolution:
    paged = decide_paged_attention(config, capability, auto_devices)
    prefix = decide_prefix_caching(config, capability, paged)
    return Resolution(
        paged,
        prefix,
        choose_backend(config, capability, paged),
        choose_weight_format(weights, capability),
    )
