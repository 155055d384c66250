"""The one step that shapes the model (shaping.py): the loaded model and the resolved weight
choice in, the model the engine runs out with what each pass did, in order; the realized report
carries that list, and a weight format that cannot be held stops the build before any rewrite."""

import pytest
import torch
from intentserve.policy import (
    PagedAttentionRequiredError,
    Reason,
    ReasonCode,
    WeightChoice,
    WeightFormat,
)
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.shaping import (
    DECODE_LAYERS,
    NORMS_AND_ACTIVATIONS,
    PROJECTIONS,
    shape_model,
)
from intentserve.worker.model.registry import load_model

from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_hf_folder

CHOSEN = Reason(ReasonCode.WEIGHT_FORMAT_AUTO, "the test's choice")
DEQUANTIZED = WeightChoice(WeightFormat.DEQUANTIZED, WeightFormat.DEQUANTIZED, CHOSEN)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    config = tiny_config()
    return write_hf_folder(tmp_path_factory.mktemp("tiny"), config, random_hf_weights(config))


def fresh(folder):
    return load_model(str(folder), dtype="float32")


def test_on_the_cpu_the_step_returns_the_model_and_what_each_pass_did(tiny_folder):
    loaded = fresh(tiny_folder)
    shaped = shape_model(loaded, DEQUANTIZED, None, torch.device("cpu"))
    assert shaped.model is loaded.model
    assert [s.what for s in shaped.steps] == [PROJECTIONS, NORMS_AND_ACTIVATIONS]
    assert all(s.did for s in shaped.steps)  # each says which kernel runs, or why torch does


def test_without_packing_the_projections_say_torch_runs_them(tiny_folder):
    shaped = shape_model(
        fresh(tiny_folder), DEQUANTIZED, None, torch.device("cpu"), cpu_prepack=False
    )
    assert shaped.steps[0].did == "torch F.linear (packing turned off)"


def test_a_weight_format_this_worker_cannot_hold_stops_it_before_any_rewrite(tiny_folder):
    loaded = fresh(tiny_folder)
    modules = [type(m) for m in loaded.model.modules()]
    refused = Reason(ReasonCode.WEIGHT_FORMAT_UNAVAILABLE, "no int8 kernels here")
    choice = WeightChoice(WeightFormat.INT8, WeightFormat.INT8, CHOSEN, rejection=refused)
    with pytest.raises(PagedAttentionRequiredError, match="no int8 kernels here"):
        shape_model(loaded, choice, None, torch.device("cpu"))
    assert [type(m) for m in loaded.model.modules()] == modules


def test_the_realized_report_carries_the_steps_in_order(tiny_folder):
    engine = (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=64, max_num_seqs=2)
        .build(loaded=fresh(tiny_folder))
    )
    report = engine.realized
    whats = [s.what for s in report.shaping]
    assert whats == [PROJECTIONS, NORMS_AND_ACTIVATIONS, DECODE_LAYERS]
    said = report.describe().splitlines()
    lines = [f"{s.what}: {s.did}" for s in report.shaping]
    assert [line for line in said if line in lines] == lines
    assert report.matmuls == report.shaping[0].did
