"""How deep a JSON value a request may nest: MAX_JSON_DEPTH levels of objects and arrays in any
field that holds JSON (an output schema, a tool's parameters, a tool call's arguments, the chat
template's variables). Deeper is refused naming the field before anything parses or renders it
again: the worker's JSON parser recurses (Python's json raises RecursionError past about 1,000
levels), protobuf's decoder refuses a Struct of 34 levels (upb's limit of 100 nested messages,
three a level), and the HTTP body's parser stops at 200 (jiter's).

Levels count containers: `1` is 0 levels, `{}` and `[1]` are 1, `{"a": [1]}` is 2.
"""

from __future__ import annotations

import re

from google.protobuf import struct_pb2

# A real schema nests far less (each level of properties is two: `properties` and the property);
# a Struct of 33 levels is the deepest that protobuf decodes inside a request.
MAX_JSON_DEPTH = 32


def _within(limit: int) -> re.Pattern[bytes]:
    """JSON's skeleton (strings, and containers as parens) nested at most `limit` levels: one
    pattern of possessive repeats, so matching is linear and never backtracks."""
    string = rb'"[^"]*+"'
    container = rb"\((?:" + string + rb")*+\)"
    for _ in range(limit - 1):
        container = rb"\((?:" + string + rb"|" + container + rb")*+\)"
    return re.compile(rb"(?:" + string + rb"|" + container + rb")*+")


_WITHIN = _within(MAX_JSON_DEPTH)
_SKELETON = bytes.maketrans(b"[{]}", b"(())")
_NOT_SKELETON = bytes(set(range(256)) - set(b'[]{}"'))


def text_over(text: str) -> bool:
    """Whether JSON `text` nests deeper than MAX_JSON_DEPTH levels. Read from its skeleton (its
    escapes dropped, then all but quotes and brackets) by one regular expression at C speed, in
    time linear in the text (tens of ms for 4 MB at worst), with no recursion whatever the text.
    Unbalanced brackets are not JSON, which the worker's own check names: not refused here."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return False
    skeleton = text.encode().replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = skeleton.translate(_SKELETON, _NOT_SKELETON)
    end = _WITHIN.match(skeleton).end()
    if end == len(skeleton):
        return False
    # It stopped at a container nested too deep, or at brackets that do not pair.
    return skeleton[end] == ord("(") and skeleton.count(b"(") == skeleton.count(b")")


def struct_over(struct: struct_pb2.Struct) -> bool:
    """Whether a Struct (itself a level) nests deeper than MAX_JSON_DEPTH levels, read level by
    level."""
    level: list[struct_pb2.Struct | struct_pb2.ListValue] = [struct]
    for _ in range(MAX_JSON_DEPTH):
        level = [inner for container in level for inner in _containers(container)]
        if not level:
            return False
    return True


def struct_chars(struct: struct_pb2.Struct) -> int:
    """The characters of a Struct's keys and strings (the text a template may render of it)."""
    num_chars, level = 0, [struct]
    while level:
        num_chars += sum(len(text) for container in level for text in _texts(container))
        level = [inner for container in level for inner in _containers(container)]
    return num_chars


def _values(container: struct_pb2.Struct | struct_pb2.ListValue):
    if isinstance(container, struct_pb2.Struct):
        return container.fields.values()
    return container.values


def _containers(container):
    for value in _values(container):
        kind = value.WhichOneof("kind")
        if kind == "struct_value":
            yield value.struct_value
        elif kind == "list_value":
            yield value.list_value


def _texts(container):
    if isinstance(container, struct_pb2.Struct):
        yield from container.fields.keys()
    for value in _values(container):
        if value.WhichOneof("kind") == "string_value":
            yield value.string_value
