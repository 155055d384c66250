"""Where a bench run writes its raw results unless `--out` says otherwise: outside the source
tree, in `$XDG_CACHE_HOME/intentserve/bench/` (`~/.cache/intentserve/bench/` when it is unset).
Recorded runs live on the `bench-results` branch; docs/benchmarks.md summarizes them."""

from __future__ import annotations

import os
from pathlib import Path


def default_out(name: str) -> Path:
    """The default path of a bench's results file called `name` (e.g. "engine.json")."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "intentserve" / "bench" / name
