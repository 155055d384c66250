"""Session-wide test settings."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import torch

# The triton_paged kernels run on CPU tensors under Triton's interpreter where there is no CUDA
# device. It is chosen when triton is first imported (its own helpers are wrapped then), so here,
# before any test imports it. On a CUDA host the kernels compile (the `gpu` layer).
if not torch.cuda.is_available():
    assert "triton" not in sys.modules, "triton was imported before the interpreter was chosen"
    os.environ.setdefault("TRITON_INTERPRET", "1")

_HOME = tempfile.mkdtemp(prefix="intentserve-home-")


def pytest_configure(config) -> None:
    # `up` writes the admin CLI's credentials under INTENTSERVE_HOME: keep the tests' own
    # (and their `up` subprocesses') out of the user's home.
    os.environ["INTENTSERVE_HOME"] = _HOME


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)
