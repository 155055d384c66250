"""The client library (intentserve.client) speaks the contract only: an application imports it
without the controller, the worker, torch or ray."""

from pathlib import Path

import pytest

from tests.import_checks import offenders, parts_loaded_by

CLIENT = Path(__file__).resolve().parents[2] / "client"
FORBIDDEN = {"intentserve.worker", "intentserve.controller", "torch", "ray"}


def test_client_sources_import_no_side_torch_or_ray():
    assert offenders(CLIENT, FORBIDDEN) == []


@pytest.mark.integration
def test_importing_the_client_loads_no_side_torch_or_ray():
    assert parts_loaded_by(["intentserve.client"], FORBIDDEN) == []
