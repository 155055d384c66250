"""The wheel is one import package, `intentserve`, with everything a user installs.

It is built from the checkout (`pip wheel --no-deps .`) and installed into a fresh venv whose only
other packages are the dependencies, borrowed from the test environment through a `.pth` file.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import intentserve
import pytest
from intentserve.worker.kernels.table import KERNELS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {"intentserve": "proto/intentserve", "intentserve.policy": "policy"}
PACKAGE_DIRS |= {"intentserve.common": "common", "intentserve.client": "client"}
PACKAGE_DIRS |= {"intentserve.worker": "worker", "intentserve.controller": "controller"}
# Every library's C source (from the kernels' table) and the headers they share.
KERNEL_SOURCES = (*(kernel.source for kernel in KERNELS), "common/vec16.h", "gemm/amx.h")
KERNEL_SOURCES += ("layers/decode_step.h",)

pytestmark = pytest.mark.integration


def _source_packages() -> set[str]:
    """Every folder of the checkout that holds an `__init__.py`, as its import name."""
    names = set()
    for package, folder in PACKAGE_DIRS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            names.add(".".join((package, *relative)))
    return names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", dist, ROOT], check=True)
    (path,) = dist.glob("intentserve-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; dependencies come from this test environment."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root], check=True)
    python = root / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Every site dir of this environment: a venv may itself borrow its dependencies through a
    # .pth (a worktree's venv does), and a .pth is read only in a site dir, not in a path it adds.
    borrowed = [sysconfig.get_paths()["purelib"]]
    borrowed += [p for p in sys.path if Path(p).name == "site-packages" and p not in borrowed]
    (Path(site) / "deps.pth").write_text("".join(f"{p}\n" for p in borrowed))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "--python", python]
    subprocess.run([*pip, "install", "--no-deps", wheel], check=True)
    return root


def _site_folders() -> list[str]:
    return [p for p in sys.path if p.endswith("site-packages")]


def _run(venv: Path, *argv: str) -> subprocess.CompletedProcess:
    # NOTE: cwd is not the checkout, so only the installed copy can be imported.
    return subprocess.run(
        argv, cwd=venv, capture_output=True, text=True, env={"PATH": f"{venv}/bin:/usr/bin:/bin"}
    )


def test_the_only_top_level_package_is_intentserve(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert top == {"intentserve"}


def test_every_package_folder_of_the_checkout_is_in_the_wheel(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packed = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert _source_packages() - packed == set()


def test_the_cpu_kernel_sources_are_in_the_wheel(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = "intentserve/worker/kernels"
    assert {f"{kernels}/{name}" for name in KERNEL_SOURCES} <= names


def test_the_installed_package_imports_from_the_venv_and_the_old_names_are_gone(venv):
    probe = (
        "import importlib.util, intentserve, intentserve.v1.worker_pb2_grpc, intentserve.convert\n"
        "import intentserve.policy, intentserve.common.tls, intentserve.client\n"
        "import intentserve.controller.server\n"
        "print(intentserve.__file__)\n"
        "folders = ('policy', 'worker', 'controller', 'common', 'client')\n"
        "print([n for n in folders if importlib.util.find_spec(n)])"
    )
    out = _run(venv, "python", "-c", probe)
    assert out.returncode == 0, out.stderr
    location, old_names = out.stdout.split("\n")[:2]
    assert location.startswith(str(venv))
    assert old_names == "[]"


def test_the_installed_cli_answers_help_and_version(venv):
    help_out = _run(venv, "intentserve", "--help")
    assert help_out.returncode == 0, help_out.stderr
    assert "policy-table" in help_out.stdout and " up " in help_out.stdout.replace("\n", " ")
    version = _run(venv, "intentserve", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"intentserve {intentserve.__version__}"


def test_the_cuda_extra_resolves_beside_the_pinned_torch():
    """`pip install '.[cuda]'` must not ask for another torch (vllm-flash-attn pins 2.4.0): a dry
    run in this environment, whose torch is the one the Makefile pins, keeps that torch."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-build-isolation",
            f"{ROOT}[cuda]",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    would = [line for line in done.stdout.splitlines() if line.startswith("Would install")]
    assert would and "torch" not in would[0] and "vllm" not in would[0], would
