"""Helpers for the tests that keep each part's imports honest (purity and boundaries)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def imported_roots(path: Path) -> list[str]:
    """Top-level package of every absolute import statement in the file, in order."""
    roots = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.append(node.module.split(".")[0])
    return roots


def roots_loaded_by(modules: Iterable[str], watched: Iterable[str]) -> list[str]:
    """Which of the `watched` top-level packages a fresh interpreter has loaded after importing
    `modules` (a fresh one: in this process another test may have imported them already)."""
    code = (
        "import importlib, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        f"watched = {set(watched)!r}\n"
        "print(','.join(sorted({m.split('.')[0] for m in sys.modules} & watched)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [name for name in out.stdout.strip().split(",") if name]
