"""controller/ talks to workers over gRPC only: it never imports worker/ or torch, and ray only in
the launcher (which creates the worker actors by import path, never importing worker/ itself)."""

from pathlib import Path

from tests.import_checks import imported_roots, roots_loaded_by

CONTROLLER = Path(__file__).resolve().parents[2] / "controller"
FORBIDDEN = {"worker", "torch", "ray"}
# NOTE: `intentserve up` must start Ray and create actors; that is launcher.py's whole job.
ALLOWED = {("launcher.py", "ray")}


def test_controller_sources_import_no_worker_torch_or_ray_outside_the_launcher():
    offenders = [
        f"{path.name}: {root}"
        for path in sorted(CONTROLLER.glob("*.py"))
        for root in imported_roots(path)
        if root in FORBIDDEN and (path.name, root) not in ALLOWED
    ]
    assert offenders == []


def test_starting_the_controller_loads_no_heavy_runtime():
    assert roots_loaded_by(["controller.server"], FORBIDDEN) == []


def test_the_admin_cli_loads_neither_ray_nor_torch():
    # `intentserve status` should answer fast: ray is imported only when `up` runs.
    assert roots_loaded_by(["controller.cli"], FORBIDDEN) == []
