"""Every layer of a decode step in one compiled call (decode_layers.c, gemma_layers.c): the same
hidden states, bit for bit, as the Python layers on the same kernels; the same greedy text; and
the Python path wherever the call does not apply, with the reason in the realized report."""

import gc
import shutil
import weakref

import pytest
import torch
from intentserve.worker.attention.torch_paged import SHORT_PREFILL_READS
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.kernels import KernelUnavailable, bf16_gemm_kernel, f32_gemm_kernel
from intentserve.worker.model.decode_layers import CompiledDecode, _why_not
from intentserve.worker.model.registry import load_model

from tests.worker.model.tiny_checkpoints import (
    random_hf_weights,
    tiny_config,
    write_gguf,
    write_hf_folder,
)

pytestmark = pytest.mark.skipif(
    not any(shutil.which(n) for n in ("cc", "gcc", "clang")),
    reason="no C compiler (cc, gcc or clang) to build the CPU kernels",
)
PROMPTS = ["def add(a, b):", "hello there", "the cat sat on", "x = 1\ny ="]


def folder(tmp_path, architecture="llama", **overrides):
    """A tiny random model: an HF folder, or for Gemma 3 a GGUF file (float32 tensors)."""
    # rotary's kernel takes 16-lane half heads
    config = tiny_config(architecture, head_dim=32, **overrides)
    weights = random_hf_weights(config)
    if architecture == "gemma3":
        return write_gguf(tmp_path / "tiny.gguf", config, weights)
    return write_hf_folder(tmp_path, config, weights)


def engine(path, dtype="bfloat16", max_num_seqs=4, weights="auto", kv_bytes=1 << 20, loaded=None):
    return (
        EngineBuilder()
        .weights(weights)
        .paged_attention("on")
        .kv_cache_memory(bytes=kv_bytes)
        .scheduler(max_model_len=64, max_num_seqs=max_num_seqs)
        .build(loaded=loaded or load_model(str(path), dtype=dtype))
    )


def gemm_kernel_lacks(dtype: str) -> str:
    """Why this host has no GEMM kernel for `dtype`'s dequantized projections, or ""."""
    try:
        bf16_gemm_kernel() if dtype == "bfloat16" else f32_gemm_kernel()
    except KernelUnavailable as error:
        return error.reason
    return ""


def compiled_or_skip(eng):
    said = eng.realized.describe()
    if "decode layers: one compiled call per step" not in said:
        pytest.skip(f"the compiled decode does not run on this host: {said.splitlines()[-1]}")
    return eng.runner.model


@pytest.mark.parametrize(
    ("architecture", "weights", "dtype", "overrides"),
    [
        ("llama", "dequantized", "bfloat16", {}),
        ("qwen2", "dequantized", "bfloat16", {}),
        ("llama", "w8a8", "bfloat16", {}),
        ("llama", "dequantized", "float32", {}),
        ("qwen2", "dequantized", "float32", {}),
        ("llama", "w8a8", "float32", {}),
        ("mistral", "dequantized", "bfloat16", {"sliding_window": 3}),
        ("gemma3", "dequantized", "bfloat16", {}),
        ("gemma3", "dequantized", "float32", {}),
        ("gemma3", "w8a8", "bfloat16", {}),
    ],
    ids=[
        "llama",
        "qwen2-qkv-bias",
        "llama-w8a8",
        "llama-fp32",
        "qwen2-fp32",
        "llama-w8a8-fp32",
        "mistral-sliding-window",
        "gemma3",
        "gemma3-fp32",
        "gemma3-w8a8",
    ],
)
def test_a_decode_step_gives_the_python_layers_hidden_states_bit_for_bit(
    tmp_path, monkeypatch, architecture, weights, dtype, overrides
):
    """Gemma 3's tiny model has 5 banded layers (a band of 5 tokens, shorter than the prompts
    and their decodes: the band and the local RoPE base count) and one global layer."""
    path = folder(tmp_path, architecture=architecture, **overrides)
    eng = engine(path, dtype=dtype, weights=weights)
    same_hidden_states_both_ways(eng, monkeypatch)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gemmas_query_multiplier_is_applied_in_the_call_as_in_the_python_layers(
    tmp_path, monkeypatch, dtype
):
    """A query_pre_attn_scalar other than head_dim (Gemma 3 27B's) is a multiplier of q after
    rotary; set here on a tiny model (a GGUF file's scalar is head_dim but at 27B's depth)."""
    loaded = load_model(str(folder(tmp_path, architecture="gemma3")), dtype=dtype)
    for layer in loaded.model.layers:
        layer.self_attn.q_multiplier = 1.3
    same_hidden_states_both_ways(engine(None, loaded=loaded), monkeypatch)


@pytest.mark.model
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_native_weights_decode_in_one_call_bit_for_bit(smollm2_path, monkeypatch, dtype):
    """SmolLM2's GGUF file held native (weights: native): its projections on the file's blocks
    (Q4_1, interleaved) and its embedding's rows dequantized from them (Q8_0), in the call."""
    native_in_one_call(smollm2_path, monkeypatch, dtype)


@pytest.mark.model
def test_native_k_quants_decode_in_one_call_bit_for_bit(smollm2_variants, monkeypatch):
    """SmolLM2 rewritten as Q6_K: its projections interleaved as K-quant tiles (gguf_kx8.h),
    which the call reaches through the same GGUF matmul pointer as every other type."""
    eng = native_in_one_call(smollm2_variants["Q6_K"], monkeypatch, "float32")
    parts = [part for layer in eng.runner.model.layers for part in layer.mlp.down_proj.parts]
    assert {part.qtype.name for part in parts} == {"Q6_K"}
    assert all(part.interleaved for part in parts)


def native_in_one_call(path, monkeypatch, dtype):
    """An engine on `path` held native, each of its steps run both ways (the same hidden states);
    returns the engine."""
    eng = engine(path, dtype=dtype, weights="native", kv_bytes=16 << 20)
    why = _why_not(eng.runner.model, eng.runner.attention)
    if why == "the decode attention is not the compiled kernel":
        pytest.skip(f"the compiled decode does not run on this host: {why}")
    assert why == ""  # nothing of the native model keeps the Python layers
    same_hidden_states_both_ways(eng, monkeypatch)
    return eng


@pytest.mark.model
@pytest.mark.parametrize(
    ("weights", "dtype"),
    [("native", "bfloat16"), ("native", "float32"), ("dequantized", "bfloat16")],
)
def test_gemma3_decodes_in_one_call_bit_for_bit(gemma3_path, monkeypatch, weights, dtype):
    """Gemma 3 270M's Q4_K_M file, held native (Q4_K, Q5_0, Q6_K and Q8_0 blocks, the tied
    Q8_0 embedding's rows dequantized in the call) or dequantized to bf16: every layer (15
    banded, 3 global) in the call, the same hidden states as the Python layers, and the same
    greedy tokens with the call and without it."""
    if weights == "dequantized" and (lacks := gemm_kernel_lacks(dtype)):
        pytest.skip(f"the {dtype} projections are not on the GEMM kernel the call drives: {lacks}")
    eng = engine(gemma3_path, dtype=dtype, weights=weights, kv_bytes=16 << 20)
    why = _why_not(eng.runner.model, eng.runner.attention)
    if why == "the decode attention is not the compiled kernel":
        pytest.skip(f"the compiled decode does not run on this host: {why}")
    assert why == ""  # nothing of Gemma 3 keeps the Python layers
    same_hidden_states_both_ways(eng, monkeypatch)
    monkeypatch.undo()
    model = eng.runner.model
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    fast = [out.new_token_ids for out in eng.generate(PROMPTS, params)]
    compiled, model.compiled_decode = model.compiled_decode, None
    slow = [out.new_token_ids for out in eng.generate(PROMPTS, params)]
    model.compiled_decode = compiled
    assert fast == slow


def same_hidden_states_both_ways(eng, monkeypatch) -> None:
    """Every step run by the Python layers and again with the compiled call (where it applies):
    equal hidden states, decode steps of every sequence among them."""
    model = compiled_or_skip(eng)
    compared, ran = [], []
    forward, run = type(model).forward, model.compiled_decode.run

    def tracking_run(*args):
        result = run(*args)
        ran.append(result is not None)
        return result

    def both_ways(self, input_ids, positions, attn, meta):
        compiled, self.compiled_decode = self.compiled_decode, None
        python = forward(self, input_ids, positions, attn, meta)  # writes this step's K/V
        self.compiled_decode = compiled
        got = forward(self, input_ids, positions, attn, meta)  # writes the same K/V again
        if ran.pop():  # the compiled call ran this step
            compared.append((len(input_ids), torch.equal(got, python)))
        return got

    model.compiled_decode.run = tracking_run
    monkeypatch.setattr(type(model), "forward", both_ways)
    eng.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert compared and all(same for _, same in compared), compared
    assert any(rows == len(PROMPTS) for rows, _ in compared)  # decode steps of every sequence


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("architecture", ["llama", "gemma3"])
def test_greedy_text_is_the_same_with_and_without_the_compiled_call(tmp_path, dtype, architecture):
    eng = engine(folder(tmp_path, architecture=architecture), dtype=dtype)
    model = compiled_or_skip(eng)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    fast = [out.new_token_ids for out in eng.generate(PROMPTS, params)]
    compiled, model.compiled_decode = model.compiled_decode, None
    slow = [out.new_token_ids for out in eng.generate(PROMPTS, params)]
    model.compiled_decode = compiled
    assert fast == slow


def test_where_the_call_does_not_apply_the_python_layers_run_and_the_report_says_why(
    tmp_path,
):
    path = folder(tmp_path)
    int8 = engine(path, weights="int8")
    said = (
        "per-layer Python (a projection is not on the dtype's GEMM kernel, the int8 one or the "
        "GGUF one)"
    )
    assert said in int8.realized.describe()
    assert int8.runner.model.compiled_decode is None
    out = int8.generate(["hello"], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out[0].new_token_ids) == 3
    # A float16 engine is only built where the CPU computes float16 (an EPYC without
    # avx512_fp16 refuses it, and oneDNN cannot pack its weights there), so the reason is
    # asked of the check itself, on a model whose weights are float16.
    model, attention = int8.runner.model, int8.runner.attention
    model.embed_tokens.weight.data = model.embed_tokens.weight.data.half()
    assert CompiledDecode.build(model, attention) == (
        None,
        "the model is float16, not bfloat16 or float32",
    )


def test_a_short_prefill_runs_in_the_compiled_call_and_a_long_one_in_the_python_layers(
    tmp_path,
):
    """A prefill chunk whose query tokens times context tokens are within SHORT_PREFILL_READS
    is kernel rows like decodes (torch_paged.py), so its whole step is one compiled call; a
    longer one goes to SDPA, and its step to the Python layers."""
    eng = engine(folder(tmp_path))
    model = compiled_or_skip(eng)
    runs = []
    run = model.compiled_decode.run

    def counting(*args):
        result = run(*args)
        runs.append(result is not None)
        return result

    model.compiled_decode.run = counting
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    short = "a longer prompt than one token"
    assert len(eng.tokenizer.encode(short)) ** 2 <= SHORT_PREFILL_READS
    eng.generate([short], params)
    assert runs == [True, True, True]  # the prefill, then 2 decodes
    runs.clear()
    long = "x" * 50
    assert len(eng.tokenizer.encode(long)) ** 2 > SHORT_PREFILL_READS
    eng.generate([long], params)
    assert runs == [False, True, True]


def test_a_token_id_or_position_outside_the_tables_is_refused_before_anything_is_read(tmp_path):
    """The call reads the embedding and rotary rows itself: an id past the vocabulary or a
    position past the table is an IndexError (as torch's embedding gives), not a read out of
    bounds."""
    eng = engine(folder(tmp_path))
    model = compiled_or_skip(eng)
    steps = []
    run = model.compiled_decode.run

    def keeping(input_ids, positions, attention, meta):
        steps.append((input_ids.clone(), positions.clone(), attention, meta))
        return run(input_ids, positions, attention, meta)

    model.compiled_decode.run = keeping
    eng.generate(["hello"], SamplingParams(max_tokens=2, ignore_eos=True))
    input_ids, positions, attention, meta = steps[-1]
    assert run(input_ids, positions, attention, meta) is not None  # the step as it was
    vocab, max_pos = model.embed_tokens.weight.shape[0], model.rotary.cos.shape[0]
    for ids, pos in [
        (torch.full_like(input_ids, vocab), positions),
        (torch.full_like(input_ids, -1), positions),
        (input_ids, torch.full_like(positions, max_pos)),
    ]:
        with pytest.raises(IndexError, match="out of range"):
            run(ids, pos, attention, meta)


def test_a_dropped_engine_frees_its_model_without_waiting_for_the_garbage_collector(tmp_path):
    # The model owns its compiled step; a step holding the model back made a reference cycle,
    # so a dropped engine's weights stayed until the collector next ran (inside whatever ran
    # then: the next engine's load, in bench/native_gguf.py's READY).
    eng = engine(folder(tmp_path))
    model = weakref.ref(compiled_or_skip(eng))
    eng.generate(["hello"], SamplingParams(max_tokens=2, ignore_eos=True))
    gc.disable()
    try:
        del eng
        assert model() is None
    finally:
        gc.enable()
