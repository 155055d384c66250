"""What is wrong with bytes that do not parse as the message a method expects, with the field
named where one can be (`prompt: is not valid UTF-8`, `stop.stop: ...`).

The protobuf runtime only says that parsing failed. This walks the wire format along the
message's descriptor to find the first field at fault: a string that is not UTF-8, a length or
a varint that runs past the end, a wire type that does not exist.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from intentserve.common.field_errors import FieldViolation

_MAX_DEPTH = 32  # our messages nest two deep; a bound keeps a hostile one from recursing far


class _Problem(Exception):
    def __init__(self, field: str, why: str) -> None:
        super().__init__(why)
        self.violation = FieldViolation(field, why)


def describe_parse_error(descriptor: Descriptor, data: bytes) -> FieldViolation:
    """Why `data` is not a valid message of `descriptor`'s type: the field at fault (its path,
    `stop.stop`) or, when no field can be named, the message's name (`GenerateRequest`)."""
    try:
        _walk(descriptor, data, "", 0)
    except _Problem as problem:
        return problem.violation
    return FieldViolation(
        descriptor.name, f"the request is not a valid {descriptor.full_name} message"
    )


# JSON in a request (a Struct and what it holds): the field that holds it is the one named.
_JSON_TYPES = frozenset(
    {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}
)
# protobuf's parser decodes this many levels of messages (upb's default), no more.
PARSER_DEPTH = 100


def _walk(descriptor: Descriptor, data: bytes, path: str, depth: int, held: str = "") -> None:
    """`held`: the field whose JSON (a Struct) `data` is inside, if any."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos, descriptor.name)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise _Problem(descriptor.name, "field number 0 is not valid")
        field = descriptor.fields_by_number.get(number)
        name = path + (field.name if field is not None else f"field {number}")
        if wire_type == 0:
            _, pos = _varint(data, pos, name)
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
            if pos > len(data):
                raise _Problem(name, "the message ends inside this field")
        elif wire_type == 2:
            length, pos = _varint(data, pos, name)
            if pos + length > len(data):
                raise _Problem(name, f"its length ({length} bytes) runs past the end")
            _check_value(field, data[pos : pos + length], name, depth, held)
            pos += length
        else:
            raise _Problem(name, f"wire type {wire_type} is not valid here")


def _check_value(
    field: FieldDescriptor | None, value: bytes, name: str, depth: int, held: str
) -> None:
    if field is None:
        return  # an unknown field: the parser keeps it, whatever it holds
    if field.type == FieldDescriptor.TYPE_STRING:
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as error:
            problem = f"is not valid UTF-8 (byte {error.start} of the value)"
            raise _Problem(name, problem) from None
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        held = held or (name if field.message_type.full_name in _JSON_TYPES else "")
        if depth >= _MAX_DEPTH:
            # Only a message that failed to parse is walked: past our own messages' depth, what
            # failed is the nesting itself (a Struct level is three messages deep).
            raise _Problem(
                held or name,
                f"nested deeper than protobuf decodes ({PARSER_DEPTH} levels of messages: JSON "
                f"in a request at most {PARSER_DEPTH // 3} levels deep)",
            )
        _walk(field.message_type, value, f"{name}.", depth + 1, held)


def _varint(data: bytes, pos: int, name: str) -> tuple[int, int]:
    value = 0
    for shift in range(0, 70, 7):
        if pos >= len(data):
            raise _Problem(name, "the message ends inside a varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
    raise _Problem(name, "a varint longer than 10 bytes")
