"""A refused request field as a typed value: `FieldError` names the field and says why, and
wherever it crosses gRPC it travels as a `google.rpc.BadRequest` field violation (in the status's
`grpc-status-details-bin` trailer, or in a multiplexed call's error event's `details`), so that
each edge (gRPC clients, the HTTP API's `param`) reads the field from the detail, never from the
message's text.

    raise FieldError("stop.max_tokens", "900 does not fit ...")   # INVALID_ARGUMENT
    violation_of(error)  # FieldViolation("stop.max_tokens", "900 does not fit ...") or None
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status


@dataclass(frozen=True)
class FieldViolation:
    field: str  # the request's field path, as its sender named it (`sampling.temperature`)
    description: str


class FieldError(ValueError):
    """A request field is refused (INVALID_ARGUMENT); `field` names it."""

    def __init__(self, field: str, description: str) -> None:
        super().__init__(f"{field}: {description}")
        self.field = field
        self.field_violation = FieldViolation(field, description)


def details_of(violation: FieldViolation | None) -> list[any_pb2.Any]:
    """google.rpc.Status details carrying `violation` (none without one)."""
    if violation is None:
        return []
    detail = any_pb2.Any()
    detail.Pack(
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=violation.field, description=violation.description
                )
            ]
        )
    )
    return [detail]


def violation_in(details: Iterable[any_pb2.Any]) -> FieldViolation | None:
    """The first BadRequest field violation among status details."""
    for detail in details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            for violation in bad.field_violations:
                return FieldViolation(violation.field, violation.description)
    return None


def violation_of(error: BaseException) -> FieldViolation | None:
    """The field violation an error carries: its own (`field_violation`), or in a gRPC call's
    status details."""
    violation = getattr(error, "field_violation", None)
    if isinstance(violation, FieldViolation):
        return violation
    if isinstance(error, grpc.Call):
        status = rpc_status.from_call(error)
        return None if status is None else violation_in(status.details)
    return None
