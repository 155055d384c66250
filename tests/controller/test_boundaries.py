"""controller/ talks to workers over gRPC only: it never imports worker/ or torch, and ray only in
the launcher (which creates the worker actors by import path, never importing worker/ itself)."""

import ast
import subprocess
import sys
from pathlib import Path

CONTROLLER = Path(__file__).resolve().parents[2] / "controller"
FORBIDDEN = {"worker", "torch", "ray"}
# NOTE: `intentserve up` must start Ray and create actors; that is launcher.py's whole job.
ALLOWED = {("launcher.py", "ray")}


def test_controller_sources_import_no_worker_torch_or_ray_outside_the_launcher():
    offenders = []
    for path in sorted(CONTROLLER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            offenders += [
                f"{path.name}: {n}"
                for n in names
                if n.split(".")[0] in FORBIDDEN and (path.name, n.split(".")[0]) not in ALLOWED
            ]
    assert offenders == []


def test_starting_the_controller_loads_no_heavy_runtime():
    code = (
        "import sys, controller.server\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'worker', 'torch', 'ray'})\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
