"""Every response becomes plain data here (the same dicts feed the CLI's tables and `--json`):
enum values read as lower-case words ("ready", "paged"), an unset message as None, and every
other field is present with its value."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


def _enum_word(field: FieldDescriptor, number: int) -> str:
    """`WORKER_STATE_READY` -> "ready": the name less the prefix its `*_UNSPECIFIED` value has."""
    enum_type = field.enum_type
    prefix = enum_type.values[0].name.removesuffix("UNSPECIFIED")
    value = enum_type.values_by_number.get(number)
    return value.name.removeprefix(prefix).lower() if value is not None else str(number)


def to_data(msg: Message) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.is_repeated:
            data[field.name] = [_value(field, v) for v in value]
        elif field.message_type is not None and not msg.HasField(field.name):
            data[field.name] = None
        elif field.has_presence and field.message_type is None and not msg.HasField(field.name):
            data[field.name] = None  # an `optional` scalar left unset
        else:
            data[field.name] = _value(field, value)
    return data


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return to_data(value)
    if field.enum_type is not None:
        return _enum_word(field, value)
    return value
