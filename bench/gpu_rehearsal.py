"""`make gpu-rehearsal`: the GPU lease's check, rehearsed on this CPU in the lease's environment, so
that the lease's 15 minutes are not spent finding a missing package or a CPU-only assumption.

    make gpu-rehearsal                          # into .gpu-rehearsal/ (git-ignored)
    python bench/gpu_rehearsal.py --dir DIR     # what the target runs

The steps, each recorded (a failed one with its error; the others still run):

1. `venv`: a fresh venv of only what the lease's image has (bench/lease_image.txt): the image's
   packages the check needs, at the image's versions where this machine's index serves them, with
   what they depend on that the image holds (what it does not, pulled in by a newer release here
   than the image's, is removed again). No Ray, no pydantic: pydantic reaches the lease as a
   carried wheel, Ray not at all (LEASE_WITHOUT). torch is the CPU build these machines install
   (2.13.0: this interpreter's own, linked in file by file, where it is that release); the
   lease's 2.11 has no CPU wheel here, so step 6 reads 2.11's own files instead.
2. `wheels`: exactly what bench/gpu_wheels.sh fetches (for this Python), into DIR/whl.
3. `lease_script`: bench/gpu_lease.sh as the lease runs it (the wheels installed with `--no-deps
   --target`, then `make gpu-check`), with the venv's python3 first on PATH and the check's
   `--dry-run`: every part of the check, on the CPU, from the carried wheels.
4. `imports`: every module the check's scripts import (at their top or inside a part), imported
   there; `intentserve` must come from the carried wheel.
5. `gpu_layer`: every test file that holds a `gpu` test, collected and run there: the CPU paths
   pass and each CUDA parameter skips with its reason; with them the CPU's stand-ins for what
   only a CUDA host shows (STAND_INS).
6. `torch_api`: every torch name the GPU path uses (bench/torch_api.py) found in torch 2.11's
   wheel, read as files.
7. `requirements`: every runtime requirement of the carried wheel installed there, except those
   LEASE_WITHOUT names (with the reason), which must be absent, so the steps above ran without them.

Writes DIR/rehearsal.json and DIR/rehearsal.md; exit 1 if a step failed. Needs the package index
(this machine's or PyPI) and a C compiler (the CPU kernels and Triton's interpreter tests).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.lease_host_parts import skip_reasons  # noqa: E402
from bench.torch_api import check as check_torch_api  # noqa: E402

IMAGE_LIST = ROOT / "bench" / "lease_image.txt"
# Runtime requirements the lease has neither on its image nor carried, and why the check needs
# none of them (the rehearsal's venv lacks them too, so a check that needed one fails here).
LEASE_WITHOUT = {
    "ray": "the check runs no Ray: its served part starts the controller and the worker as "
    "processes of their own; Ray's wheel (~70 MB) is over the 64 MiB a lease carries",
}
# The CPU build these machines install, standing in for the lease's torch (its CPU wheel is not
# served here); TORCH_LEASE's own wheel is read for the names the GPU path uses.
TORCH_HERE = "torch==2.13.0"
TORCH_LEASE = "2.11.0"
# The image's packages the check needs: the project's runtime requirements that the image holds
# (grpcio and protobuf are carried too, newer, and win on PYTHONPATH), and what the check and its
# test files import (transformers as the reference, Triton, pytest, hypothesis).
IMAGE_NEEDS = (
    "numpy",
    "tokenizers",
    "safetensors",
    "jinja2",
    "pyyaml",
    "uvloop",
    "prometheus-client",
    "grpcio",
    "protobuf",
    "transformers",
    "triton",
    "pytest",
    "hypothesis",
)
# Where the rehearsal must differ from the image, and why. Triton's interpreter (the CPU's stand-in
# for the lease's compiled kernels) of the image's Triton 3.6 turns a loop bound into an int with
# `int(handle.data)` on a 1-element array, which NumPy refuses from 2.4 on ("only 0-dimensional
# arrays can be converted to Python scalars"); the image's NumPy 2.5.2 is not served for this
# Python anyway. The lease compiles the kernels, so only this interpreter meets it.
REHEARSAL_PINS = {"numpy": "2.3.5"}
# What pip puts in every venv; the image has them too.
VENV_OWN = {"pip", "setuptools", "wheel"}
# CPU stand-ins for what only a CUDA host (or the CUDA image) shows, run with the gpu layer: the
# reference's tensors on the query's device (the meta device for CUDA), the interpreter's tests as
# a CUDA host collects them, the CUDA image's C compiler for Triton.
STAND_INS = (
    "tests/worker/engine/test_reference.py",
    "tests/worker/engine/test_triton_devices.py",
    "tests/deploy/test_dockerfile.py::test_the_cuda_image_has_the_c_compiler_triton_builds_its_"
    "launcher_with",
)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lease_image(path: Path = IMAGE_LIST) -> dict[str, str]:
    """name -> version ('' where no session read one) of every package on the lease's image."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            found[normalize(name)] = version
    return found


def _run(cmd, *, timeout: float, env=None, cwd=ROOT) -> subprocess.CompletedProcess:
    shown = " ".join(str(c).splitlines()[0] if str(c) else "''" for c in cmd)
    print(f"[gpu-rehearsal]   $ {shown[:200]}", flush=True)
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        tail = (done.stdout[-3000:] + "\n" + done.stderr[-3000:]).strip()
        raise RuntimeError(f"exit {done.returncode}: {' '.join(map(str, cmd))[:200]}\n{tail}")
    return done


class Rehearsal:
    def __init__(self, where: Path):
        self.dir = where.resolve()
        self.venv = self.dir / "venv"
        self.python = self.venv / "bin" / "python"
        self.site = self.dir / "site"  # the lease's /tmp/site
        self.wheels = self.dir / "whl"
        self.out = self.dir / "out"

    def lease_env(self) -> dict[str, str]:
        """The environment of a command on the lease: its python3 first on PATH, the carried
        wheels on PYTHONPATH, nothing of this checkout's own venv."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TRITON_INTERPRET", "PYTHONHOME")
        }
        path = [p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p]
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), *path])
        env["PYTHONPATH"] = str(self.site)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    # 1 ---------------------------------------------------------------------------------------
    def venv_of_the_image(self) -> dict:
        image = lease_image()
        shutil.rmtree(self.venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", self.venv], timeout=300)
        pip = [self.python, "-m", "pip", "--disable-pip-version-check"]
        # This interpreter's own torch, where it is TORCH_HERE, is linked in file by file (its
        # RECORD): the same files pip would unpack from the same wheel, in seconds, not a minute
        # and more; pip then installs only what torch requires.
        linked = _link_distribution("torch", TORCH_HERE.split("==")[1], self.venv)
        # --no-compile: each module is compiled when first imported, as in the lease's
        # --target install (seconds less for every package nothing here imports).
        _run([*pip, "install", "-q", "--no-compile", TORCH_HERE], timeout=1200)
        asked, unserved = [], {}
        for name in IMAGE_NEEDS:
            version = image[normalize(name)]
            if name in REHEARSAL_PINS:
                unserved[name] = f"{version or 'any'} (here {REHEARSAL_PINS[name]}: REHEARSAL_PINS)"
                version = REHEARSAL_PINS[name]
            elif version and not self._served(name, version):
                unserved[name] = version
                version = ""
            asked.append(f"{name}=={version}" if version else name)
        _run([*pip, "install", "-q", "--no-compile", *asked], timeout=1200)
        listed = json.loads(_run([*pip, "list", "--format", "json"], timeout=120).stdout)
        installed = {normalize(d["name"]): d["version"] for d in listed}
        # What pip pulled in that the image lacks (a newer release here of a package the image
        # holds may need more than the image's does): removed, so that this venv, like the lease,
        # has only the image's packages, and a check that needed one of them fails here first.
        off_image = sorted(set(installed) - set(image) - VENV_OWN)
        if off_image:
            _run([*pip, "uninstall", "-q", "-y", *off_image], timeout=300)
        return {
            "torch_linked_from": linked,
            "packages": len(installed) - len(off_image),
            "removed_not_on_the_image": off_image,
            "versions": {n: installed[normalize(n)] for n in ("torch", *IMAGE_NEEDS)},
            "lease_versions_not_used_here": unserved,
        }

    def _served(self, name: str, version: str) -> bool:
        done = subprocess.run(
            [self.python, "-m", "pip", "index", "versions", name],
            capture_output=True,
            text=True,
            timeout=120,
        )
        line = next((x for x in done.stdout.splitlines() if "Available versions:" in x), "")
        return version in [v.strip() for v in line.split(":", 1)[-1].split(",")]

    # 2 ---------------------------------------------------------------------------------------
    def carried_wheels(self) -> dict:
        env = {
            **self.lease_env(),
            "PY": str(self.python),
            "WHL_PYTHON": sysconfig.get_python_version(),
            "WHL_DIR": str(self.wheels),
        }
        _run(["bash", "bench/gpu_wheels.sh"], env=env, timeout=900)
        wheels = sorted(p.name for p in self.wheels.glob("*.whl"))
        size = sum(p.stat().st_size for p in self.wheels.glob("*.whl"))
        return {"wheels": len(wheels), "mib": round(size / 2**20, 1), "names": wheels}

    # 3 ---------------------------------------------------------------------------------------
    def lease_script(self) -> dict:
        shutil.rmtree(self.site, ignore_errors=True)
        shutil.rmtree(self.out, ignore_errors=True)
        env = {
            **self.lease_env(),
            "WHL_DIR": str(self.wheels),
            "SITE": str(self.site),
            "OUT": str(self.out),
            "GPU_CHECK_ARGS": "--dry-run",
        }
        done = _run(["bash", "bench/gpu_lease.sh"], env=env, timeout=1500)
        report = json.loads((self.out / "gpu_check.json").read_text())
        parts = report["parts"]
        failed = {k: v.get("error", "") for k, v in parts.items() if not v["ok"]}
        if failed or set(parts) != set(report["asked"]) or not parts:
            raise RuntimeError(f"the dry run's parts failed or did not run: {failed or parts}")
        lines = [x for x in done.stdout.splitlines() if x.startswith("[gpu-check]")]
        return {
            "parts": {k: v["seconds"] for k, v in parts.items()},
            "host": report.get("host", {}),
            "last": lines[-1] if lines else "",
        }

    # 4 ---------------------------------------------------------------------------------------
    def imports(self) -> dict:
        modules = sorted(check_imports())
        probe = (
            "import importlib, json, sys\n"
            "bad = {}\n"
            "for m in sys.argv[1:]:\n"
            "    try:\n"
            "        importlib.import_module(m)\n"
            "    except BaseException as e:\n"
            "        bad[m] = f'{type(e).__name__}: {e}'\n"
            "import intentserve\n"
            "print(json.dumps({'bad': bad, 'intentserve': intentserve.__file__}))\n"
        )
        env = {**self.lease_env(), "TRITON_INTERPRET": "1"}
        done = _run([self.python, "-c", probe, *modules], env=env, timeout=600)
        found = json.loads(done.stdout.strip().splitlines()[-1])
        if found["bad"]:
            raise RuntimeError(f"these modules do not import on the lease: {found['bad']}")
        if not Path(found["intentserve"]).is_relative_to(self.site):
            raise RuntimeError(f"intentserve came from {found['intentserve']}, not the wheel")
        return {"modules": len(modules), "intentserve_from": found["intentserve"]}

    # 5 ---------------------------------------------------------------------------------------
    def gpu_layer(self) -> dict:
        files = gpu_test_files()
        env = self.lease_env()
        pytest = [self.python, "-m", "pytest", "-p", "no:cacheprovider"]
        collect = [*pytest, *files, "-q", "--collect-only", "-m", "gpu"]
        collected = _run(collect, env=env, timeout=600)
        gpu_tests = sum("::" in x for x in collected.stdout.splitlines())
        # The dry run's gpu_tests part ran its files in the lease's environment already (step 3):
        # its skips are read from its report, and only the other files run here.
        part = json.loads((self.out / "gpu_check.json").read_text())["parts"]["gpu_tests"]
        rest = [f for f in files if f not in part["files"]]
        done = _run([*pytest, *rest, *STAND_INS, "-q", "-rs"], env=env, timeout=1500)
        summary = done.stdout.strip().splitlines()[-1]
        reasons = dict(part["skips"])
        for reason, count in skip_reasons(done.stdout).items():
            reasons[reason] = reasons.get(reason, 0) + count
        if not gpu_tests:
            raise RuntimeError(f"no gpu test collected from {files}")
        if any(not r.strip() for r in reasons):
            raise RuntimeError(f"a test skipped without a reason: {reasons}")
        return {
            "files": [*files, *STAND_INS],
            "run_by_the_dry_run": part["files"],
            "gpu_tests": gpu_tests,
            "summary": f"dry run's: {part['summary']}; here: {summary}",
            "skips": reasons,
        }

    # 6 ---------------------------------------------------------------------------------------
    def torch_api(self) -> dict:
        folder = self.dir / "torch-wheel"
        wheels = sorted(folder.glob(f"torch-{TORCH_LEASE}-*.whl"))
        if not wheels:
            # Any platform's wheel holds the same Python files and stubs; macOS's is the CPU build
            # (~80 MB, not the CUDA one's gigabytes). Read, never installed.
            _run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                 "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                 "--platform", "macosx_11_0_arm64", "-d", folder, f"torch=={TORCH_LEASE}"],
                timeout=900,
            )  # fmt: skip
            wheels = sorted(folder.glob(f"torch-{TORCH_LEASE}-*.whl"))
        venv_site = next(self.venv.glob("lib/python*/site-packages"))
        found = check_torch_api(wheels[0], reference=venv_site)
        if found["missing"]:
            raise RuntimeError(f"not in torch {TORCH_LEASE}: {found['missing']}")
        return {
            "wheel": wheels[0].name,
            **{k: found[k] for k in ("release", "names", "found")},
            "unfollowed": sorted(found["unfollowed"]),
        }

    # 7 ---------------------------------------------------------------------------------------
    def requirements(self) -> dict:
        from importlib.metadata import distributions

        venv_site = next(self.venv.glob("lib/python*/site-packages"))
        ours = next(d for d in distributions(path=[str(self.site)]) if d.name == "intentserve")
        present = {normalize(d.name) for d in distributions(path=[str(self.site), str(venv_site)])}
        needed = {
            normalize(re.match(r"[A-Za-z0-9_.\-]+", r).group(0))
            for r in ours.requires or []
            if "extra ==" not in r
        }
        missing = sorted(needed - present - LEASE_WITHOUT.keys())
        if missing:
            raise RuntimeError(f"runtime requirements the lease would lack: {missing}")
        there = sorted(LEASE_WITHOUT.keys() & present)
        if there:
            raise RuntimeError(f"installed, so the rehearsal did not run without them: {there}")
        return {"needed": len(needed), "absent_by_design": LEASE_WITHOUT}


def check_imports() -> set[str]:
    """Every module the check's scripts import, at their top or inside a function: those of
    bench/gpu_*.py and bench/lease_*.py (the check's parts, whichever way gpu_check.py reaches
    them) and of the bench/ modules they import."""
    seen: set[str] = {Path(__file__).resolve()}  # this rehearsal does not run on the lease
    modules: set[str] = set()
    todo = sorted((ROOT / "bench").glob("gpu_*.py")) + sorted((ROOT / "bench").glob("lease_*.py"))
    while todo:
        path = todo.pop().resolve()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name == "__future__":
                    continue
                modules.add(name)
                if name.split(".")[0] == "bench":
                    todo.append(ROOT / (name.replace(".", "/") + ".py"))
    return modules


def _link_distribution(name: str, version: str, venv: Path) -> str:
    """Distribution `name` of this interpreter, if it is `version`, into `venv`'s site-packages:
    each file its RECORD lists, hard-linked (copied across file systems). Returns where it came
    from, "" where this interpreter has not got that version (pip then installs it)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return ""
    if dist.version.split("+")[0] != version or not dist.files:  # 2.13.0+cpu is 2.13.0
        return ""
    source = Path(dist.locate_file(""))
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    for file in dist.files:
        if ".." in file.parts:
            continue  # a console script in bin/: the check never runs torch's
        origin, target = source / file, site / file
        if not origin.is_file():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(origin, target)
        except OSError:
            shutil.copy2(origin, target)
    return str(source)


def gpu_test_files() -> list[str]:
    """The test files that hold a test marked `gpu` (the mark in their code, `pytest.mark.gpu`,
    not a mention of it in text)."""

    def marks_gpu(path: Path) -> bool:
        return any(
            isinstance(node, ast.Attribute)
            and node.attr == "gpu"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark"
            for node in ast.walk(ast.parse(path.read_text()))
        )

    return sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if marks_gpu(p)
    )


STEPS = (
    ("venv", "venv_of_the_image"),
    ("wheels", "carried_wheels"),
    ("lease_script", "lease_script"),
    ("imports", "imports"),
    ("gpu_layer", "gpu_layer"),
    ("torch_api", "torch_api"),
    ("requirements", "requirements"),
)
NEEDS = {"wheels": "venv", "lease_script": "wheels", "imports": "lease_script"}
NEEDS |= {"gpu_layer": "lease_script", "requirements": "lease_script", "torch_api": "venv"}


def write_report(results: dict, where: Path) -> None:
    (where / "rehearsal.json").write_text(json.dumps(results, indent=2, default=str))
    lines = [
        "# gpu-rehearsal",
        "",
        "| step | ok | seconds | finding |",
        "| --- | --- | --- | --- |",
    ]
    for name, step in results["steps"].items():
        finding = step.get("error") or json.dumps(
            {k: v for k, v in step.items() if k not in ("ok", "seconds")}, default=str
        )
        lines.append(f"| {name} | {step['ok']} | {step['seconds']} | {finding[:600]} |")
    (where / "rehearsal.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=ROOT / ".gpu-rehearsal", help="work folder")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    rehearsal = Rehearsal(args.dir)
    results: dict = {"python": sysconfig.get_python_version(), "steps": {}}
    for name, method in STEPS:
        start = time.perf_counter()
        print(f"[gpu-rehearsal] {name} ...", flush=True)
        before = NEEDS.get(name)
        if before and not results["steps"][before]["ok"]:
            step = {"ok": False, "error": f"not run: step {before} failed"}
        else:
            try:
                step = {"ok": True, **getattr(rehearsal, method)()}
            except Exception as exc:  # noqa: BLE001 - a failed step is a result
                step = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        step["seconds"] = round(time.perf_counter() - start, 1)
        results["steps"][name] = step
        print(f"[gpu-rehearsal] {name}: {'ok' if step['ok'] else 'FAILED'}", flush=True)
        if not step["ok"]:
            print(step["error"][-4000:], flush=True)
        write_report(results, args.dir)
    failed = [n for n, s in results["steps"].items() if not s["ok"]]
    print(f"[gpu-rehearsal] wrote {args.dir}/rehearsal.json and .md; failed: {failed or 0}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
