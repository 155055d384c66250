"""Errors raised by the policy layer.

Every message names the field or the mode involved and what would have been allowed, so the
text can be shown to an operator as is (CLI exit message, gRPC status detail, startup log).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from intentserve.policy.reasons import Reason


class PolicyError(Exception):
    """Base of every error the policy layer raises."""


class IntentError(PolicyError, ValueError):
    """An operator intent that cannot be expressed: bad value, conflicting fields."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class PagedAttentionRequiredError(PolicyError):
    """A required feature (`paged_attention: on`, `prefix_caching: on`, an explicitly named
    attention backend) cannot be realized on this worker."""

    def __init__(
        self, reason: Reason, setting: str = "paged_attention: on", subject: str = "PagedAttention"
    ) -> None:
        super().__init__(f"{subject} was explicitly requested ({setting}), but {reason.message}")
        self.reason = reason
        self.setting = setting


class PolicyViolationError(PolicyError):
    """What a worker realized contradicts the policy (a required feature missing, `off` ignored)."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(reason.message)
        self.reason = reason
