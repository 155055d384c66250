"""test_triton_paged's two devices as a CUDA host collects them: there tests/conftest.py leaves
Triton's interpreter off (the kernels compile for the device), so the `interpreter` parameters
cannot run and must skip, naming why, instead of failing their interpreter assertion. A CUDA host
is stood in for by a plugin that makes torch.cuda.is_available() answer True before any conftest
is read; only the `interpreter` parameters are selected, so nothing touches a device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.integration

PLUGIN = "import torch\ntorch.cuda.is_available = lambda: True\n"


def test_on_a_cuda_host_the_interpreter_parameters_skip_with_the_reason(tmp_path):
    (tmp_path / "as_if_cuda.py").write_text(PLUGIN)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(":")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "as_if_cuda",
            "-p",
            "no:cacheprovider",
            "tests/worker/engine/test_triton_paged.py",
            "-k",
            "interpreter",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    assert "passed" not in out.splitlines()[-1] and "failed" not in out.splitlines()[-1], out
    assert "skipped" in out.splitlines()[-1], out
    assert "a CUDA host compiles the kernels for the device" in out, out
