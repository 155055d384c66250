"""Host memory on 2 MiB pages (worker/hugepages.py): arenas hand out aligned, zeroed tensors that
outlive them; where the host grants transparent huge pages, a touched arena is on them and torch's
own large allocation is not; the packed weights move into one arena with every output unchanged,
and an engine built on the CPU holds them there."""

from __future__ import annotations

import gc
import mmap

import pytest
import torch
from intentserve.worker import hugepages
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.hugepages import (
    HUGE_PAGE,
    HugePageArena,
    huge_page_bytes,
    move_weights_to_huge_pages,
    thp_mode,
)
from intentserve.worker.kernels import f32_gemm_kernel
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.packed_linear import F32Linear, prepack_linears
from intentserve.worker.model.registry import load_model

from tests.worker.model.kernel_paths import built_or_skip
from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_hf_folder

GRANTS = thp_mode() in ("always", "madvise")
needs_thp = pytest.mark.skipif(
    not GRANTS,
    reason=f"this host's transparent huge pages are {thp_mode()!r}: no 2 MiB pages to ask for",
)


@pytest.fixture(scope="module")
def f32_kernel():
    return built_or_skip(f32_gemm_kernel, "float32 GEMM kernel")


def test_the_setting_is_the_bracketed_word(tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert thp_mode(setting) == "madvise"
    setting.write_text("[never]\n")
    assert thp_mode(setting) == "never"
    assert thp_mode(tmp_path / "missing") == "unavailable"


@pytest.mark.parametrize("mode", ["host", "never"])
def test_an_arena_hands_out_aligned_zeroed_tensors_that_outlive_it(monkeypatch, mode):
    if mode == "never":  # no huge pages to ask for: torch's own zeroed bytes, used the same way
        monkeypatch.setattr(hugepages, "thp_mode", lambda: "never")
    arena = HugePageArena(1000)
    a = arena.take((3, 5), torch.float32)
    b = arena.take((7,), torch.bfloat16)
    assert a.shape == (3, 5) and a.dtype == torch.float32 and a.is_contiguous()
    assert a.data_ptr() % 64 == 0 and b.data_ptr() % 64 == 0
    assert b.data_ptr() >= a.data_ptr() + a.nbytes  # no overlap
    assert not a.any() and not b.any()
    assert arena.free_bytes == 1000 - (64 + b.nbytes)
    with pytest.raises(ValueError, match=r"needs 4000 bytes; the arena has 872 of 1000 left"):
        arena.take((1000,), torch.float32)

    a.fill_(3.0)
    del arena
    gc.collect()
    assert torch.equal(a, torch.full((3, 5), 3.0))  # the tensor keeps its memory


@needs_thp
def test_a_touched_arena_is_on_2mib_pages_and_memory_no_one_advised_is_not():
    arena = HugePageArena(8 << 20)
    block = arena.take((8 << 20,), torch.uint8)
    assert block.data_ptr() % HUGE_PAGE == 0
    block.fill_(1)
    assert huge_page_bytes(block) >= 4 * HUGE_PAGE

    if thp_mode() == "madvise":  # only asked-for memory gets them
        # NOTE: a mapping of its own: torch's allocator may place a tensor in heap memory that
        # other code in this process advised (a CI run found one on 102 MiB of huge pages).
        plain_map = mmap.mmap(-1, 8 << 20)
        plain = torch.frombuffer(plain_map, dtype=torch.uint8)
        plain.fill_(1)
        assert huge_page_bytes(plain) == 0
        del plain
        plain_map.close()


def tiny_f32_model():
    config = tiny_config()
    return LlamaModel.from_hf_weights(config, random_hf_weights(config), torch.float32)


def test_the_packed_weights_move_into_one_arena_with_every_output_unchanged(f32_kernel):
    model = tiny_f32_model()
    prepack_linears(model)
    linears = [m for m in model.modules() if isinstance(m, F32Linear)]
    gen = torch.Generator().manual_seed(0)
    inputs = {m: torch.randn(3, m.in_features, generator=gen) for m in linears}
    before = {m: m(inputs[m]) for m in linears}
    old = [m.packed for m in linears]

    moved = move_weights_to_huge_pages(model)

    assert moved == HugePageArena.size_for(old)
    first = min(m.packed.data_ptr() for m in linears)
    assert all(m.packed.data_ptr() + m.packed.nbytes <= first + moved for m in linears)
    assert all(m.packed.data_ptr() != o.data_ptr() for m, o in zip(linears, old, strict=True))
    assert all(torch.equal(m.packed, o) for m, o in zip(linears, old, strict=True))
    assert all(torch.equal(m(inputs[m]), before[m]) for m in linears)
    assert move_weights_to_huge_pages(tiny_f32_model()) == 0  # nothing packed: nothing moved


def test_an_engine_built_on_the_cpu_holds_its_packed_weights_in_one_arena(tmp_path, f32_kernel):
    config = tiny_config(head_dim=32)
    path = write_hf_folder(tmp_path, config, random_hf_weights(config))
    engine = (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=64, max_num_seqs=2)
        .build(loaded=load_model(str(path), dtype="float32"))
    )
    packed = [t for name, t in engine.runner.model.named_buffers() if name.endswith("packed")]
    assert len(packed) == 4 * config.num_layers + 1
    first = min(t.data_ptr() for t in packed)
    span = HugePageArena.size_for(packed)
    assert all(first <= t.data_ptr() and t.data_ptr() + t.nbytes <= first + span for t in packed)
    if GRANTS:
        assert first % HUGE_PAGE == 0
