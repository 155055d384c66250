"""Helpers for the tests that keep each part's imports honest (purity and boundaries).

A *part* is what a boundary is drawn around: `intentserve.policy`, `intentserve.worker`,
`intentserve.controller`, `intentserve.v1` inside the project, or a third-party top-level
package (`torch`, `grpc`, `ray`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROJECT = "intentserve"


def part_of(module: str) -> str:
    """`intentserve.worker.engine.builder` -> `intentserve.worker`; `torch.nn` -> `torch`."""
    names = module.split(".")
    return ".".join(names[:2]) if names[0] == PROJECT and len(names) > 1 else names[0]


def imported_parts(path: Path) -> list[str]:
    """The part of every absolute import statement in the file, in order."""
    parts = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            parts += [part_of(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == PROJECT:  # `from intentserve import convert`
                parts += [part_of(f"{PROJECT}.{alias.name}") for alias in node.names]
            else:
                parts.append(part_of(node.module))
    return parts


def offenders(folder: Path, forbidden: set[str], allowed: set[tuple[str, str]] = frozenset()):
    """`file: part` for every import of a forbidden part under `folder` (its subfolders too),
    except the (relative file, part) pairs in `allowed`."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        name = path.relative_to(folder).as_posix()
        found += [
            f"{name}: {part}"
            for part in imported_parts(path)
            if part in forbidden and (name, part) not in allowed
        ]
    return found


def parts_loaded_by(modules: Iterable[str], watched: Iterable[str]) -> list[str]:
    """Which of the `watched` parts a fresh interpreter has loaded after importing `modules`
    (a fresh one: in this process another test may have imported them already). A subprocess, so
    the tests that call it are marked `integration`."""
    code = (
        "import importlib, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        f"watched = {set(watched)!r}\n"
        "loaded = {'.'.join(m.split('.')[:2]) if m.startswith('intentserve.') else m.split('.')[0]"
        " for m in sys.modules}\n"
        "print(','.join(sorted(loaded & watched)))"
    )
    return _names_printed_by(code)


def loaded_beyond_stdlib(module: str) -> list[str]:
    """Every module outside the standard library that importing `module` loads in a fresh
    interpreter (the module itself included), by full name. A subprocess, as above."""
    code = (
        "import importlib, sys\n"
        "before = set(sys.modules)\n"
        f"importlib.import_module({module!r})\n"
        "new = set(sys.modules) - before\n"
        "print(','.join(sorted(m for m in new if m.split('.')[0] not in sys.stdlib_module_names)))"
    )
    return _names_printed_by(code)


def _names_printed_by(code: str) -> list[str]:
    """The comma-separated names the `code` prints, run in a fresh interpreter in the checkout."""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [name for name in out.stdout.strip().split(",") if name]
