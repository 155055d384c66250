"""The schedulers and the block allocator are pure Python: importing them loads no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
MODULES = [
    "worker.sched.sequence",
    "worker.sched.scheduler",
    "worker.sched.paged_scheduler",
    "worker.sched.default_scheduler",
    "worker.cache.block_allocator",
    "worker.cache.kv_usage",
]


def test_importing_the_schedulers_does_not_import_torch():
    # A fresh interpreter: in this one another test may have imported torch already.
    code = (
        f"import importlib, sys\n"
        f"for name in {MODULES!r}:\n"
        f"    importlib.import_module(name)\n"
        f"loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        f"assert not loaded, loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
