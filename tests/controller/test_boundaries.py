"""controller/ talks to workers over gRPC only: it never imports worker/, torch or ray."""

import ast
import subprocess
import sys
from pathlib import Path

CONTROLLER = Path(__file__).resolve().parents[2] / "controller"
FORBIDDEN = {"worker", "torch", "ray"}


def test_controller_sources_import_no_worker_torch_or_ray():
    offenders = []
    for path in sorted(CONTROLLER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_starting_the_controller_loads_no_heavy_runtime():
    code = (
        "import sys, controller.server\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'worker', 'torch', 'ray'})\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
