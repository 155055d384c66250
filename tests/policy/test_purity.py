"""policy/ is pure: no grpc, torch, ray, protobuf, logging or I/O modules."""

import ast
from pathlib import Path

from tests.import_checks import imported_roots, roots_loaded_by

POLICY = Path(__file__).resolve().parents[2] / "policy"
FORBIDDEN = {
    "grpc", "google", "torch", "ray", "numpy", "logging", "os", "io", "socket",
    "subprocess", "pathlib", "shutil", "threading", "asyncio", "time", "random",
}  # fmt: skip


def test_policy_sources_import_nothing_impure():
    offenders = [
        f"{path.name}: {root}"
        for path in sorted(POLICY.glob("*.py"))
        for root in imported_roots(path)
        if root in FORBIDDEN
    ]
    assert offenders == []


def test_policy_sources_do_no_io():
    calls = [
        f"{path.name}:{node.lineno}: {node.func.id}()"
        for path in sorted(POLICY.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) in {"open", "print", "input"}
    ]
    assert calls == []


def test_importing_policy_loads_no_heavy_runtime():
    assert roots_loaded_by(["policy"], {"grpc", "torch", "ray", "google"}) == []
