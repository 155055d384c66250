"""Hugging Face model ids (`org/name`) resolved from the local Hub cache only, never the network.

A worker never downloads: the operator fills the cache beforehand (`hf download org/name`, or
any earlier transformers / huggingface_hub use) and the loader reads the snapshot `refs/main`
points at.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError
from intentserve.worker.model.loaded import ModelLoadError

# `org/name`: one slash, each side a Hub name (letters, digits, '-', '_', '.'), and not a file
# name ending in .gguf (a missing GGUF path must read as a missing file, not a Hub id).
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def looks_like_hub_id(ref: str) -> bool:
    return _HUB_ID.fullmatch(ref) is not None and not ref.endswith(".gguf")


def hub_cache_dir() -> Path:
    """The Hub cache folder as huggingface_hub places it, read from the environment now (not at
    import, so a process that sets HF_HOME later is honoured): $HF_HUB_CACHE, else the legacy
    $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    home = os.environ.get("HF_HOME")
    if not home:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        home = os.path.join(xdg, "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def resolve_hub_id(repo_id: str) -> Path:
    """The cached snapshot of `repo_id`: its folder, or its one .gguf file when it holds GGUF
    files and no config.json. ModelLoadError names the id and the cache folder when absent."""
    cache = hub_cache_dir()
    try:
        # local_files_only: a cache lookup, no HTTP request at all (whatever HF_HUB_OFFLINE says).
        snapshot = Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError as exc:
        raise ModelLoadError(
            repo_id,
            f"not a local path, and Hugging Face model {repo_id!r} is not in the Hub cache "
            f"{str(cache)!r} (models are never downloaded at load time: fill the cache first, "
            f"e.g. `hf download {repo_id}`, or set HF_HUB_CACHE / HF_HOME)",
        ) from exc
    if (snapshot / "config.json").is_file():
        return snapshot
    ggufs = sorted(snapshot.glob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        names = [p.name for p in ggufs]
        raise ModelLoadError(
            snapshot, f"the snapshot holds several GGUF files {names}; name one by its path"
        )
    return snapshot  # the folder loader names what is missing
