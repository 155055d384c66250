"""A GGUF file's header in one pass: its metadata as Python values, and each tensor's type and
bytes as a view of the memory-mapped file (nothing is copied).

NOTE: the `gguf` package's reader makes a numpy view per header field part, ~250,000 of them for
a tokenizer of 49,152 tokens and merges: 3.5 s of a worker's start on a 2-core machine. Read
here with `struct` on the mapped bytes, the same header takes a small fraction of that.
(tests/worker/model/test_gguf_header.py holds it to the package's reader.)

Layout (little-endian): magic "GGUF", version (2 or 3), tensor count, metadata count; each
metadata entry is a key string, a value type and a value (arrays: element type, count,
elements); then each tensor's name, dims (innermost first), type and offset; the tensor data
starts at the next multiple of `general.alignment` (32 by default).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
# value type -> struct format of one scalar
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
# tensor types stored as plain numbers (the rest are blocks of bytes)
_PLAIN = {
    QType.F32: np.float32,
    QType.F16: np.float16,
    QType.F64: np.float64,
    QType.I8: np.int8,
    QType.I16: np.int16,
    QType.I32: np.int32,
    QType.I64: np.int64,
}


class GGUFHeaderError(ValueError):
    """Not a GGUF file this reader takes, or one cut short; the message says what is wrong."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: QType
    data: np.ndarray  # [rows..., cols] of numbers, or [rows..., bytes per row] of blocks
    shape: tuple[int, ...] = ()  # in elements, innermost first (cols, rows...), as gguf's reader


@dataclass(frozen=True)
class GGUFHeader:
    metadata: dict[str, Any]
    tensors: tuple[GGUFTensor, ...]


class _Cursor:
    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self.offset = 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buffer, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.scalar("Q")
        end = self.offset + size
        if end > len(self.buffer):
            raise GGUFHeaderError(f"a string of {size} bytes runs past the end of the file")
        text = bytes(self.buffer[self.offset : end]).decode("utf-8")
        self.offset = end
        return text

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            return self.array(self.scalar("I"), self.scalar("Q"))
        if value_type not in _SCALARS:
            raise GGUFHeaderError(f"unknown metadata value type {value_type}")
        return self.scalar(_SCALARS[value_type])

    def array(self, element_type: int, count: int) -> list:
        if element_type in _SCALARS:
            dtype = np.dtype("<" + _SCALARS[element_type])
            values = np.frombuffer(self.buffer, dtype, count, self.offset)
            self.offset += dtype.itemsize * count
            return values.tolist()
        return [self.value(element_type) for _ in range(count)]


def read_gguf_header(path: Path | str) -> GGUFHeader:
    """GGUFHeaderError (or a struct/Unicode error) when the file is not one this reads."""
    mapped = np.memmap(path, np.uint8, mode="r")
    cursor = _Cursor(memoryview(mapped))
    if bytes(cursor.buffer[:4]) != MAGIC:
        raise GGUFHeaderError("no GGUF magic at the start")
    cursor.offset = 4
    version = cursor.scalar("I")
    if version not in VERSIONS:
        raise GGUFHeaderError(
            f"GGUF version {version} (a big-endian file reads as a huge one); supported: "
            f"{', '.join(map(str, VERSIONS))}, little-endian"
        )
    num_tensors, num_fields = cursor.scalar("Q"), cursor.scalar("Q")
    metadata = {}
    for _ in range(num_fields):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.scalar("I"))
    infos = []
    for _ in range(num_tensors):
        name = cursor.string()
        dims = [cursor.scalar("Q") for _ in range(cursor.scalar("I"))]
        infos.append((name, dims, QType(cursor.scalar("I")), cursor.scalar("Q")))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cursor.offset // alignment) * alignment
    return GGUFHeader(metadata, _tensors(mapped, infos, data_start))


def _tensors(mapped: np.memmap, infos: list, data_start: int) -> tuple[GGUFTensor, ...]:
    tensors, names = [], set()
    for name, dims, tensor_type, offset in infos:
        if name in names:
            raise GGUFHeaderError(f"tensor {name!r} appears twice")
        names.add(name)
        num_elements = int(np.prod(dims, dtype=np.int64))
        block_size, type_size = GGML_QUANT_SIZES[tensor_type]
        num_bytes = num_elements * type_size // block_size
        start = data_start + offset
        if start + num_bytes > len(mapped):
            raise GGUFHeaderError(
                f"tensor {name!r} ends at byte {start + num_bytes}, past the end of the file "
                f"({len(mapped)} bytes)"
            )
        shape = tuple(reversed(dims))  # [rows..., cols]
        raw = mapped[start : start + num_bytes]
        if tensor_type in _PLAIN:
            data = raw.view(_PLAIN[tensor_type]).reshape(shape)
        else:
            data = raw.reshape(quant_shape_to_byte_shape(shape, tensor_type))
        tensors.append(GGUFTensor(name, tensor_type, data, tuple(int(d) for d in dims)))
    return tuple(tensors)
