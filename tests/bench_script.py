"""Runs a bench script as its users do (`python bench/<name>.py ...`, from the repository root)
without `--out`, so each test also proves where the script's results go by default: under
`$XDG_CACHE_HOME` (here a temporary folder), never into the source tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, cache: Path, timeout: int = 300) -> tuple[dict, str]:
    """(the JSON the script wrote at its default path, its stdout); fails on a non-zero exit."""
    before = set((ROOT / "bench").rglob("*.json"))
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, f"bench/{script}.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert set((ROOT / "bench").rglob("*.json")) == before, "the bench wrote into the source tree"
    out = cache / "intentserve" / "bench" / f"{script}.json"
    return json.loads(out.read_text()), done.stdout
