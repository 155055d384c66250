"""bench/gpu_wheels.sh and bench/gpu_lease.sh, each run for real on a copy of its place in the
tree with `pip`, `python3` and `make` replaced by stand-ins that record their arguments: the
wheels script needs the network, the lease script a GPU lease, so a test checks what each would
run. The wheels' pins are checked against pyproject's, so the lease installs what the package
asks for."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def _copy_script(tmp_path: Path, name: str) -> Path:
    (tmp_path / "bench").mkdir()
    script = tmp_path / "bench" / name
    shutil.copy(ROOT / "bench" / name, script)
    return script


def _recorder(bin_dir: Path, name: str, log: Path) -> Path:
    """An executable `name` that appends its argv, as JSON, to `log`."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        f"    f.write(json.dumps([{name!r}, *sys.argv[1:]]) + '\\n')\n"
    )
    path.chmod(0o755)
    return path


def _requirement(text: str) -> tuple[str, frozenset[str]]:
    """`protobuf<8,>=7.35.1; marker` -> ("protobuf", {"<8", ">=7.35.1"}): bounds in any order."""
    text = text.split(";")[0].replace(" ", "")
    name, bounds = re.match(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?(.*)", text).groups()
    return name.lower(), frozenset(b for b in bounds.split(",") if b)


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_wheels_script_builds_the_project_and_fetches_binary_wheels_for_the_lease(tmp_path):
    script = _copy_script(tmp_path, "gpu_wheels.sh")
    log = tmp_path / "calls.jsonl"
    python = _recorder(tmp_path / "bin", "python", log)
    env = {**os.environ, "PY": str(python), "WHL_PYTHON": "3.12"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / ".whl").is_dir()  # in the copy's root, where gpu_lease.sh looks
    build, download = _calls(log)
    assert build == ["python", "-m", "pip", "wheel", "-q", "--no-deps", "-w", ".whl", "."]
    assert download[:3] == ["python", "-m", "pip"] and download[3] == "download"
    assert "--only-binary=:all:" in download and "--no-deps" in download
    assert download[download.index("--python-version") + 1] == "3.12"
    assert download[download.index("-d") + 1] == ".whl"
    # One set that works together: the images' lock, as the images install it.
    assert download[download.index("--constraint") + 1] == "deploy/image/constraints.txt"
    fetched = dict(_requirement(a) for a in download[download.index("-d") + 2 :])

    runtime = [r for r in requires("intentserve") if "extra ==" not in r]  # pyproject's own
    pins = dict(_requirement(r) for r in runtime)
    # A package named by both keeps pyproject's bounds: an older wheel there would fail the lease.
    for name in fetched.keys() & pins.keys():
        if fetched[name]:
            assert fetched[name] == pins[name], name
    # The generated modules and the TLS and HTTP fronts come from these wheels on the lease.
    assert {"protobuf", "grpcio", "cryptography", "fastapi", "gguf"} <= fetched.keys()


def _fetched_by_the_wheels_script(tmp_path: Path) -> set[str]:
    """The names gpu_wheels.sh downloads for the lease (run with a recording `python`)."""
    script = _copy_script(tmp_path, "gpu_wheels.sh")
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "PY": str(_recorder(tmp_path / "bin", "python", log))}
    subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True)
    download = _calls(log)[1]
    return {_requirement(a)[0] for a in download[download.index("-d") + 2 :]}


def test_every_runtime_requirement_is_on_the_lease_image_or_carried_to_it(tmp_path):
    """What the package needs at run time reaches the lease: the image has it (bench/
    lease_image.txt, from the device tool's KINDS.md) or gpu_wheels.sh fetches it. The one
    exception is named with its reason in gpu_rehearsal.LEASE_WITHOUT, and the rehearsal's venv
    lacks it too, so a check that needed it would fail there first."""
    from bench.gpu_rehearsal import LEASE_WITHOUT, lease_image

    image = set(lease_image())
    carried = _fetched_by_the_wheels_script(tmp_path)
    needed = {_requirement(r)[0] for r in requires("intentserve") if "extra ==" not in r}
    missing = sorted(needed - image - carried - LEASE_WITHOUT.keys())
    assert not missing, f"neither on the lease image nor fetched by gpu_wheels.sh: {missing}"
    # An exception that reaches the lease anyway, or that the package no longer needs, is stale.
    assert LEASE_WITHOUT.keys() <= needed - image - carried


def test_the_lease_script_installs_the_carried_wheels_then_runs_the_gpu_check(tmp_path):
    script = _copy_script(tmp_path, "gpu_lease.sh")
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "intentserve-0-py3-none-any.whl").write_text("")
    log = tmp_path / "calls.jsonl"
    bin_dir = tmp_path / "bin"
    _recorder(bin_dir, "python3", log)
    _recorder(bin_dir, "make", log)
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))
    env = {**os.environ, "PATH": str(bin_dir), "OUT": str(tmp_path / "out")}
    done = subprocess.run(["/bin/bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    install, check = _calls(log)
    assert install[:4] == ["python3", "-m", "pip", "install"] and "--no-index" in install
    assert install[-1] == ".whl/intentserve-0-py3-none-any.whl"
    assert install[install.index("--target") + 1] == "/tmp/site"
    assert check == ["make", "gpu-check", "PYTHON=python3", f"OUT={tmp_path / 'out'}"]

    # Where the image has no make, it runs what the target runs.
    (bin_dir / "make").unlink()
    log.unlink()
    done = subprocess.run(["/bin/bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _calls(log)[1] == ["python3", "bench/gpu_check.py", "--out", str(tmp_path / "out")]


def test_the_make_target_the_lease_calls_runs_the_gpu_check():
    done = subprocess.run(
        # NOTE: under `make test` this make is nested: without --no-print-directory it says
        # "make[1]: Entering directory ...".
        ["make", "-n", "--no-print-directory", "gpu-check", "PYTHON=python3", "OUT=/tmp/x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["python3", "bench/gpu_check.py", "--out", "/tmp/x"]
