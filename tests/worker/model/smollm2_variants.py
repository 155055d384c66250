"""Every load path on real weights: SmolLM2's packaged GGUF rewritten, at test time, as a
Hugging Face folder and as GGUF files of other tensor types (nothing is downloaded or committed).

The source is the dequantized packaged file (Q4_1/Q8_0): each variant is compared with that,
so the only difference a variant may show is its own rounding.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType
from gguf import GGUFValueType
from q6k_encoder import QK_K, quantize_q6_k

from tests.worker.model.tiny_checkpoints import hf_config_json

# Q6_K needs rows of whole 256-value blocks: SmolLM2's 576-wide rows (all but ffn_down) fall
# back to Q8_0, as llama.cpp's quantizer does with tensors a K-type cannot hold.
K_QUANT_FALLBACK = QType.Q8_0
GGUF_VARIANTS = (QType.F16, QType.BF16, QType.Q8_0, QType.Q4_0, QType.Q6_K)
T = TypeVar("T")


def read_source(path: Path) -> tuple[gguf.GGUFReader, dict[str, np.ndarray]]:
    """The reader (for its metadata) and every tensor dequantized to float32, in GGUF layout."""
    reader = gguf.GGUFReader(path)
    tensors = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        tensors[t.name] = np.array(values, dtype=np.float32).reshape(
            tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims innermost first
        )
    return reader, tensors


def tensor_type(qtype: QType, values: np.ndarray) -> QType:
    """What one tensor is stored as in the `qtype` file: vectors (norms) stay F32."""
    if values.ndim == 1:
        return QType.F32
    if qtype is QType.Q6_K and values.shape[-1] % QK_K:
        return K_QUANT_FALLBACK
    return qtype


def _encode(values: np.ndarray, qtype: QType) -> np.ndarray:
    if qtype is QType.Q6_K:
        return quantize_q6_k(values)
    return gguf.quants.quantize(values, qtype)


def rounded(values: np.ndarray, qtype: QType) -> np.ndarray:
    """`values` as the `qtype` file stores them, read back (float32, same shape).

    NOTE: blocks run along each row, so this commutes with llama.cpp's Q/K row permutation and
    can be applied to the weights in transformers' layout.
    """
    stored = tensor_type(qtype, values)
    return gguf.quants.dequantize(_encode(values, stored), stored).reshape(values.shape)


def write_variant(
    reader: gguf.GGUFReader, tensors: dict[str, np.ndarray], qtype: QType, path: Path
) -> Path:
    """The source's metadata and tensors, each stored as `tensor_type(qtype, ...)`."""
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(path, arch)
    for name, field in reader.fields.items():
        # The writer sets the architecture; file_type would describe the source's types.
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        sub_type = field.types[-1] if field.types[0] is GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    for name, values in tensors.items():
        stored = tensor_type(qtype, values)
        if stored in (QType.F32, QType.F16):
            writer.add_tensor(name, _encode(values, stored))
        else:
            writer.add_tensor(name, _encode(values, stored), raw_dtype=stored)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def write_hf_variant(loaded, weights: dict, folder: Path) -> Path:
    """config.json + model.safetensors (float32) + tokenizer.json (+ its config and template)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    tokenizer = loaded.tokenizer
    (folder / "config.json").write_text(json.dumps(hf_config_json(loaded.config)))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    backend = tokenizer.backend
    tok_config = {
        "bos_token": backend.id_to_token(tokenizer.bos_token_id),
        "eos_token": backend.id_to_token(tokenizer.eos_token_ids[0]),
        "add_bos_token": tokenizer.add_bos_token,
        "chat_template": tokenizer.chat_template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return folder
