"""The operator's mode is parsed once, at the manifest, and only typed values travel after it:
manifest -> controller -> ResolvedConfig on the wire -> the worker's engine config
(docs/architecture.md walks the same route)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from intentserve import convert
from intentserve.controller.control.convert import register_to_pb
from intentserve.controller.launch import manifest as manifest_module
from intentserve.controller.launch import section
from intentserve.policy import (
    KvBudget,
    Mode,
    PagedAttentionConfig,
    WeightFormat,
    WeightFormatStatus,
    examples,
    modes,
    resolve,
)
from intentserve.worker.runtime.spec import WorkerSpec

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def parses(monkeypatch) -> list[tuple[str, object]]:
    """Every time an operator's word is looked up as an enum member, wherever it happens."""
    calls: list[tuple[str, object]] = []
    original = modes.lookup_choice

    def counting(enum_cls, value):
        calls.append((enum_cls.__name__, value))
        return original(enum_cls, value)

    monkeypatch.setattr(modes, "lookup_choice", counting)
    monkeypatch.setattr(section, "lookup_choice", counting)
    return calls


def test_the_mode_is_parsed_once_from_manifest_to_the_workers_engine_config(parses):
    m = manifest_module.load_manifest(ROOT / "deploy" / "local.yaml")
    desired = m.controller_config().desired
    resolution = resolve(desired.policy, examples.cpu(), desired.auto_devices)
    wire = register_to_pb(
        desired, resolution, heartbeat_interval_s=1.0, token=b"t"
    ).SerializeToString()
    response = type(register_to_pb(desired, resolution, 1.0, b"t")).FromString(wire)
    config, got_resolution, budget = convert.resolution_from_pb(response.config)
    engine_config = WorkerSpec("local-0", "127.0.0.1:1").engine_config(config, budget)

    mode_words = [value for name, value in parses if name == "Mode"]
    assert mode_words == ["on"]  # the manifest's one parse; nothing after it reads words
    assert engine_config.paged == desired.policy == PagedAttentionConfig(required=True)
    assert engine_config.kv_budget == desired.kv_budget == KvBudget(num_bytes=256 << 20)
    assert got_resolution.decisions == resolution.decisions
    assert engine_config.paged.mode is Mode.ON


def test_the_architecture_walk_names_files_that_exist():
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = set(re.findall(r"`((?:deploy|controller|worker|policy|proto)/[\w/.]+)`", text))
    assert len(paths) > 15
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []


def test_the_weight_format_is_parsed_once_and_reaches_the_engine_config(parses, tmp_path):
    text = (ROOT / "deploy" / "local.yaml").read_text().replace("weights: auto", "weights: int4")
    assert "weights: int4" in text
    path = tmp_path / "local.yaml"
    path.write_text(text)
    desired = manifest_module.load_manifest(path).controller_config().desired
    capability = replace(
        examples.cpu(),
        weight_formats=(
            WeightFormatStatus(WeightFormat.INT8, True),
            WeightFormatStatus(WeightFormat.INT4, True),
        ),
    )
    resolution = resolve(desired.policy, capability, desired.auto_devices, desired.weights)
    wire = register_to_pb(
        desired, resolution, heartbeat_interval_s=1.0, token=b"t"
    ).SerializeToString()
    response = type(register_to_pb(desired, resolution, 1.0, b"t")).FromString(wire)
    config, got_resolution, budget = convert.resolution_from_pb(response.config)
    engine_config = WorkerSpec("local-0", "127.0.0.1:1").engine_config(
        config, budget, got_resolution.weights.intent
    )

    assert [value for name, value in parses if name == "WeightFormat"] == ["int4"]
    assert got_resolution.weights == resolution.weights
    assert got_resolution.weights.format is WeightFormat.INT4
    assert engine_config.weights is desired.weights is WeightFormat.INT4
