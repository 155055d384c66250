"""`pip install .` from the checkout ships the generated gRPC modules next to `policy`."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_wheel_installs_importable_grpc_modules(tmp_path):
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", tmp_path / "dist", ROOT], check=True)
    (wheel,) = (tmp_path / "dist").glob("intentserve-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)
    probe = (
        "import intentserve.v1.admin_pb2_grpc, intentserve.v1.inference_pb2_grpc, "
        "intentserve.v1.worker_pb2_grpc, intentserve.convert, policy\n"
        "print(intentserve.v1.admin_pb2_grpc.__file__)\nprint(policy.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,  # not the checkout: only the installed copy can be imported
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert all(line.startswith(str(site)) for line in out.stdout.split())
    # The CPU kernels' C sources travel in the wheel: they are compiled on the host at first use.
    kernels = site / "worker" / "attention" / "cpu_kernels"
    assert all((kernels / name).is_file() for name in ("paged_decode.c", "fused_ops.c", "vec16.h"))
