"""Session-wide test settings."""

from __future__ import annotations

import os
import shutil
import tempfile

_HOME = tempfile.mkdtemp(prefix="intentserve-home-")


def pytest_configure(config) -> None:
    # `up` writes the admin CLI's credentials under INTENTSERVE_HOME: keep the tests' own
    # (and their `up` subprocesses') out of the user's home.
    os.environ["INTENTSERVE_HOME"] = _HOME


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)
