"""intentserve.common is neutral ground: the worker, the controller and the client library all
import it, so it imports none of them (nor torch or ray, which only the worker and the launcher
need)."""

from pathlib import Path

import pytest

from tests.import_checks import offenders, parts_loaded_by

COMMON = Path(__file__).resolve().parents[2] / "common"
SIDES = {"intentserve.worker", "intentserve.controller", "intentserve.client"}
FORBIDDEN = SIDES | {"torch", "ray"}


def test_common_sources_import_no_side_torch_or_ray():
    assert offenders(COMMON, FORBIDDEN) == []


@pytest.mark.integration
def test_importing_every_common_module_loads_no_side_torch_or_ray():
    modules = [f"intentserve.common.{path.stem}" for path in sorted(COMMON.glob("[!_]*.py"))]
    assert len(modules) > 1, "the check must see the room's modules"
    assert parts_loaded_by(modules, FORBIDDEN) == []
