"""Kept output buffers for the Python layers (step_buffers.py): the same hidden states, bit for
bit, as fresh outputs; the same memory step after step; nothing that leaves the layers is a kept
buffer; one thread's buffers are not another's."""

import shutil
import threading

import pytest
import torch
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.kernels import KernelUnavailable, bf16_gemm_kernel
from intentserve.worker.model import step_buffers
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.registry import load_model
from intentserve.worker.model.step_buffers import StepBuffers

from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_hf_folder

needs_cc = pytest.mark.skipif(
    not any(shutil.which(n) for n in ("cc", "gcc", "clang")),
    reason="no C compiler (cc, gcc or clang) to build the CPU kernels",
)
# The roles of the projections that write into a given output: the bf16 kernel's (Bf16Linear).
# Where it does not run (no AVX512-BF16), F.linear or oneDNN allocate the projections' outputs.
PROJECTION_ROLES = {"qkv", "o", "gate_up", "down"}


def bf16_kernel_runs() -> bool:
    try:
        bf16_gemm_kernel()
    except KernelUnavailable:
        return False
    return True


# Prompts of different lengths: prefill steps of several sizes, so the buffers grow between them.
PROMPTS = ["def add(a, b):", "hello there " * 9, "the cat sat on", "x = 1\ny =" * 5]


def tiny_engine(tmp_path, dtype):
    config = tiny_config(head_dim=32)  # the fused kernels take 16-lane half heads
    path = write_hf_folder(tmp_path, config, random_hf_weights(config))
    return (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=128, max_num_seqs=4)
        .build(loaded=load_model(str(path), dtype=dtype))
    )


def kept_holders(model):
    return [m for m in model.modules() for a in ("out_buffer", "act_buffer") if hasattr(m, a)]


def set_kept(model, kept: dict) -> None:
    for module, (attr, value) in kept.items():
        setattr(module, attr, value)


def current_kept(model) -> dict:
    return {
        m: (a, getattr(m, a))
        for m in model.modules()
        for a in ("out_buffer", "act_buffer")
        if getattr(m, a, None) is not None
    }


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@needs_cc
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_layers_give_the_same_hidden_states_with_kept_buffers_as_with_fresh_outputs(
    tmp_path, monkeypatch, dtype
):
    eng = tiny_engine(tmp_path, dtype)
    model = eng.runner.model
    model.compiled_decode = None  # every step through the Python layers
    kept = current_kept(model)
    assert kept, "the CPU engine gave its layers no kept buffers"
    buffers = next(iter(kept.values()))[1][0]
    forward = LlamaModel.forward
    compared = []

    def both_ways(self, input_ids, positions, attn, meta):
        set_kept(self, {m: (a, None) for m, (a, _) in kept.items()})
        fresh = forward(self, input_ids, positions, attn, meta)  # writes this step's K/V
        set_kept(self, kept)
        got = forward(self, input_ids, positions, attn, meta)  # writes the same K/V again
        held = {storage(b) for b in buffers._local.kept.values()}
        compared.append((len(input_ids), torch.equal(got, fresh), storage(got) in held))
        return got

    monkeypatch.setattr(LlamaModel, "forward", both_ways)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    eng.generate(PROMPTS, params)
    assert compared and all(same for _, same, _ in compared), compared
    assert not any(aliased for _, _, aliased in compared)  # the hidden states are fresh
    assert max(rows for rows, _, _ in compared) > len(PROMPTS)  # prefills, not only decodes


@needs_cc
def test_a_second_step_of_the_same_size_writes_into_the_same_memory(tmp_path, monkeypatch):
    eng = tiny_engine(tmp_path, "bfloat16")
    model = eng.runner.model
    model.compiled_decode = None
    buffers = next(iter(current_kept(model).values()))[1][0]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    eng.generate(PROMPTS, params)
    first = {role: storage(b) for role, b in buffers._local.kept.items()}
    size = buffers.kept_bytes()
    assert set(first) == {"norm", "act"} | (PROJECTION_ROLES if bf16_kernel_runs() else set())
    again = eng.generate(PROMPTS, params)
    assert {role: storage(b) for role, b in buffers._local.kept.items()} == first
    assert buffers.kept_bytes() == size
    assert all(len(o.new_token_ids) == 3 for o in again)


def test_a_role_grows_to_the_largest_request_and_keeps_its_memory_below_it():
    buffers = StepBuffers()
    small = buffers.take("qkv", 3, 64, torch.bfloat16)
    assert small.shape == (3, 64) and small.dtype == torch.bfloat16
    large = buffers.take("qkv", 40, 64, torch.float32)
    assert large.shape == (40, 64) and storage(large) != storage(small)
    assert buffers.kept_bytes() >= 40 * 64 * 4
    again = buffers.take("qkv", 10, 64, torch.bfloat16)
    assert storage(again) == storage(large)
    assert storage(buffers.take("o", 3, 64, torch.bfloat16)) != storage(large)  # roles apart


def test_each_thread_has_its_own_buffers():
    buffers = StepBuffers()
    here = storage(buffers.take("norm", 4, 16, torch.float32))
    there = []
    thread = threading.Thread(
        target=lambda: there.append(storage(buffers.take("norm", 4, 16, torch.float32)))
    )
    thread.start()
    thread.join()
    assert there and there[0] != here
    assert storage(buffers.take("norm", 4, 16, torch.float32)) == here


def test_models_other_than_the_llama_layers_are_left_alone():
    class NotLlama(torch.nn.Module):
        layers = torch.nn.ModuleList()

    assert step_buffers.keep_step_buffers(NotLlama()) is False
