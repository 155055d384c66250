"""Hugging Face ids (`org/name`) load from the local Hub cache, with no network, or are refused
naming the id and the cache folder."""

from __future__ import annotations

import shutil
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from intentserve.worker.model import ModelLoadError, load_model, resolve_model_path
from intentserve.worker.model.facts import read_model_config
from intentserve.worker.model.hub_cache import hub_cache_dir, looks_like_hub_id
from tiny_checkpoints import random_hf_weights, tiny_config, write_gguf, write_hf_folder

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test (and HF_HUB_OFFLINE is not what keeps
    the loader offline: it is unset)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)

    attempts = []

    def refuse(*args, **kwargs):
        # Recorded as well as raised: a library could swallow the error and fall back.
        attempts.append(args)
        raise OSError("network access is forbidden in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    yield
    assert attempts == []


def cache_entry(hub: Path, repo_id: str, source: Path) -> Path:
    """The Hub cache's layout: blobs, a snapshot of links to them, refs/main naming it."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    files = [source] if source.is_file() else sorted(source.iterdir())
    for i, file in enumerate(files):
        blob = repo / "blobs" / f"blob{i}"
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_hub_id_loads_from_the_cache_without_network(tmp_path, monkeypatch, no_network, variable):
    config = tiny_config()
    folder = write_hf_folder(tmp_path / "src", config, random_hf_weights(config))
    root = tmp_path / "cache"
    hub = root if variable == "HF_HUB_CACHE" else root / "hub"
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv(variable, str(root))
    snapshot = cache_entry(hub, "SomeOrg/Tiny-Llama_v1.0", folder)

    assert resolve_model_path("SomeOrg/Tiny-Llama_v1.0") == snapshot
    loaded = load_model("SomeOrg/Tiny-Llama_v1.0", dtype="float32")
    assert loaded.config == config and loaded.source_path == snapshot
    # The worker's capability probe reads the same facts before loading.
    assert read_model_config("SomeOrg/Tiny-Llama_v1.0") == replace(
        config, bos_token_id=None, eos_token_ids=()
    )


def test_hub_id_of_a_gguf_repository_loads_its_gguf(tmp_path, monkeypatch, no_network):
    config = tiny_config()
    path = write_gguf(tmp_path / "tiny-Q8_0.gguf", config, random_hf_weights(config))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = cache_entry(tmp_path / "hub", "org/tiny-GGUF", path)
    assert resolve_model_path("org/tiny-GGUF") == snapshot / "tiny-Q8_0.gguf"
    assert load_model("org/tiny-GGUF", dtype="float32").config.num_layers == 2


def test_hub_id_not_in_the_cache_names_id_and_cache_folder(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ModelLoadError) as err:
        load_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    message = str(err.value)
    assert "'HuggingFaceTB/SmolLM2-135M-Instruct' is not in the Hub cache" in message
    assert str(tmp_path / "empty-cache") in message and "never downloaded" in message


def test_existing_local_folder_wins_over_a_hub_id(tmp_path, monkeypatch, no_network):
    config = tiny_config()
    write_hf_folder(tmp_path / "org" / "name", config, random_hf_weights(config))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert resolve_model_path("org/name").resolve() == (tmp_path / "org" / "name").resolve()


@pytest.mark.parametrize(
    ("ref", "is_hub_id"),
    [
        ("HuggingFaceTB/SmolLM2-135M-Instruct", True),
        ("Qwen/Qwen3-0.6B", True),
        ("org/model.v2_final", True),
        ("models/tiny.gguf", False),  # a missing GGUF file stays a missing file
        ("/abs/org/name", False),
        ("./org/name", False),
        ("a/b/c", False),
        ("smollm2-135m", False),
        ("org/", False),
    ],
)
def test_what_counts_as_a_hub_id(ref, is_hub_id):
    assert looks_like_hub_id(ref) is is_hub_id


def test_missing_path_that_is_not_a_hub_id_names_the_accepted_forms(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no such file or folder, not a Hugging Face id"):
        load_model(str(tmp_path / "a" / "b" / "c"))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HF_HUB_CACHE": "/x/hub-cache", "HF_HOME": "/y"}, "/x/hub-cache"),
        ({"HF_HOME": "/y"}, "/y/hub"),
        ({"XDG_CACHE_HOME": "/z"}, "/z/huggingface/hub"),
    ],
)
def test_cache_folder_follows_the_environment(monkeypatch, env, expected):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert str(hub_cache_dir()) == expected
