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

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_PARENS = str.maketrans("[{]}", "(())")
_NOT_A_PAREN = re.compile(r"[^()]+")


def text_over(text: str, limit: int) -> bool:
    """Whether JSON `text` nests deeper than `limit` levels. Its brackets are read outside its
    strings, innermost pairs removed a level at a time (each pass a copy at C speed, at most
    `limit` of them): no recursion, whatever the text. Unbalanced brackets are not JSON, which the
    worker's own check names: not refused here."""
    rest = _NOT_A_PAREN.sub("", _STRING.sub("", text).translate(_PARENS))
    for _ in range(limit):
        inner = rest.replace("()", "")
        if inner == rest:  # empty, or unbalanced
            return False
        rest = inner
    return bool(rest)


def struct_over(struct: struct_pb2.Struct, limit: int) -> bool:
    """Whether a Struct (itself a level) nests deeper than `limit` levels, read level by level."""
    level: list[struct_pb2.Struct | struct_pb2.ListValue] = [struct]
    for _ in range(limit):
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
