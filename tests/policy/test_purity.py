"""policy/ is pure: no grpc, torch, ray, protobuf, logging or I/O modules."""

import ast
import subprocess
import sys
from pathlib import Path

POLICY = Path(__file__).resolve().parents[2] / "policy"
FORBIDDEN = {
    "grpc",
    "google",
    "torch",
    "ray",
    "numpy",
    "logging",
    "os",
    "io",
    "socket",
    "subprocess",
    "pathlib",
    "shutil",
    "threading",
    "asyncio",
    "time",
    "random",
}


def test_policy_sources_import_nothing_impure():
    offenders = []
    for path in sorted(POLICY.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in {"open", "print"}:
                offenders.append(f"{path.name}:{node.lineno}: {node.func.id}()")
    assert offenders == []


def test_importing_policy_loads_no_heavy_runtime():
    code = (
        "import sys, policy\n"
        "heavy = {'grpc', 'torch', 'ray', 'google'}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
