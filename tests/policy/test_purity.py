"""intentserve.policy is pure: no grpc, torch, ray, protobuf, logging or I/O modules, and none of
the other parts of the project."""

import ast
from pathlib import Path

import pytest

from tests.import_checks import offenders, parts_loaded_by

POLICY = Path(__file__).resolve().parents[2] / "policy"
FORBIDDEN = {
    "grpc", "google", "torch", "ray", "numpy", "logging", "os", "io", "socket",
    "subprocess", "pathlib", "shutil", "threading", "asyncio", "time", "random",
    "intentserve.worker", "intentserve.controller", "intentserve.v1", "intentserve.common",
    "intentserve.client",
}  # fmt: skip


def test_policy_sources_import_nothing_impure():
    assert offenders(POLICY, FORBIDDEN) == []


def test_policy_sources_do_no_io():
    calls = [
        f"{path.name}:{node.lineno}: {node.func.id}()"
        for path in sorted(POLICY.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) in {"open", "print", "input"}
    ]
    assert calls == []


@pytest.mark.integration
def test_importing_policy_loads_no_heavy_runtime():
    watched = {"grpc", "torch", "ray", "google"}
    assert parts_loaded_by(["intentserve.policy"], watched) == []
