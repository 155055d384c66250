"""Writes deploy/image/constraints.txt: every runtime dependency of `intentserve[cluster]`,
pinned, for the images (`pip install --constraint`).

The direct dependencies are pinned to the versions installed here, the ones the tests ran with;
pip's resolver picks the rest for this Python on Linux. CUDA-only packages (nvidia-*, triton)
are left out: torch pins those itself, per CUDA build. Run with the project's venv:
`make constraints` (needs PyPI).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).with_name("constraints.txt")
EXTRA = "cluster"
CUDA_ONLY = ("nvidia-", "triton")
HEADER = """\
# Every runtime dependency of intentserve[{extra}], pinned for the images (Dockerfile).
# Written by deploy/image/lock.py (`make constraints`): the direct dependencies at the versions the
# tests ran with, the rest as pip resolved them for Python {python} on Linux. torch is installed
# first from its CPU (or CUDA) index; its CUDA-only dependencies are pinned by torch itself.
"""


def direct_pins() -> list[str]:
    """`name==version` for each direct dependency installed here; `[cluster]`'s own pins kept."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = []
    for line in project["dependencies"] + project["optional-dependencies"][EXTRA]:
        requirement = Requirement(line)
        if any(s.operator == "==" for s in requirement.specifier):
            pins.append(f"{requirement.name}{requirement.specifier}")
            continue
        try:
            pins.append(f"{requirement.name}=={version(requirement.name).split('+')[0]}")
        except PackageNotFoundError:
            continue  # not installed here: the resolver picks it
    return pins


def resolve(pins: list[str]) -> dict[str, str]:
    """What pip would install for `.[cluster]` into an empty environment, under `pins`."""
    with tempfile.TemporaryDirectory() as folder:
        constraints, report = Path(folder) / "direct.txt", Path(folder) / "report.json"
        constraints.write_text("\n".join(pins) + "\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
             "--report", report, "--constraint", constraints, f"{ROOT}[{EXTRA}]"],
            check=True,
        )  # fmt: skip
        installs = json.loads(report.read_text())["install"]
    resolved = {}
    for item in installs:
        name = canonicalize_name(item["metadata"]["name"])
        if name != "intentserve" and not name.startswith(CUDA_ONLY):
            # NOTE: no local label (2.13.0, not 2.13.0+cpu): torch's CUDA builds satisfy it too.
            resolved[name] = item["metadata"]["version"].split("+")[0]
    return resolved


def main() -> None:
    resolved = resolve(direct_pins())
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    lines = [f"{name}=={resolved[name]}" for name in sorted(resolved)]
    OUT.write_text(HEADER.format(extra=EXTRA, python=python) + "\n".join(lines) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(lines)} packages")


if __name__ == "__main__":
    main()
