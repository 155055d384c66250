"""intentserve.controller talks to workers over gRPC only: it never imports the worker or torch,
and ray only in the launcher (which creates the worker actors by import path, never importing
the worker itself). The worker, in turn, never imports the controller."""

import ast
from pathlib import Path

import pytest

from tests.import_checks import offenders, parts_loaded_by

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"intentserve.worker", "torch", "ray"}
# NOTE: `intentserve up` must start Ray and create actors; that is the launcher's whole job.
ALLOWED = {("launch/launcher.py", "ray")}


def test_controller_sources_import_no_worker_torch_or_ray_outside_the_launcher():
    assert offenders(ROOT / "controller", FORBIDDEN, ALLOWED) == []


def test_worker_sources_never_import_the_controller():
    assert offenders(ROOT / "worker", {"intentserve.controller"}) == []


@pytest.mark.integration
def test_starting_the_controller_loads_no_heavy_runtime():
    assert parts_loaded_by(["intentserve.controller.server"], FORBIDDEN) == []


@pytest.mark.integration
def test_the_admin_cli_loads_neither_ray_nor_torch():
    # `intentserve status` should answer fast: ray is imported only when `up` runs.
    assert parts_loaded_by(["intentserve.controller.cli.main"], FORBIDDEN) == []


def test_the_offender_check_sees_imports_in_subfolders(tmp_path):
    # The check must be able to fail: a controller file deep in a subfolder importing torch.
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "bad.py").write_text("from intentserve.worker.engine import engine\n")
    assert offenders(tmp_path, FORBIDDEN) == ["service/bad.py: intentserve.worker"]


def _controller_imports(folder: Path) -> list[str]:
    """`file: module` for every import of an intentserve.controller module under `folder`."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [
                f"{path.relative_to(folder).as_posix()}: {name}"
                for name in names
                if name.startswith("intentserve.controller.")
            ]
    return found


@pytest.mark.parametrize(
    ("room", "other"),
    [("router", ("control", "embedded", "server", "cli", "launch")), ("control", ("router",))],
)
def test_the_router_and_the_control_plane_never_import_each_other(room, other):
    """The router runs in processes of its own, fed by the watch stream: it reads nothing of the
    control plane; only the composition root (server.py, embedded.py) sees both."""
    forbidden = tuple(f"intentserve.controller.{name}" for name in other)
    imports = _controller_imports(ROOT / "controller" / room)
    assert [i for i in imports if i.split(": ")[1].startswith(forbidden)] == []
    assert imports, "the check must see the room's own imports"
