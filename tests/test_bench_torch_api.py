"""bench/torch_api.py: the torch names the GPU path uses, looked up in a release's files (the
lease's torch 2.11 is read from its wheel by make gpu-rehearsal; here, a made-up release and this
interpreter's own torch)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from bench.torch_api import ROOT, Files, Release, check, gpu_path_files, used_names

RELEASE = {
    "torch/__init__.py": (
        "from torch._C import *\n"
        "from torch import cuda\n"
        "from torch._tensor import Tensor\n"
        "__all__ = ['made_at_run_time']\n"
        "ops = object()\n"
        "if True:\n    float32 = 1\n"
    ),
    "torch/_C/__init__.pyi": (
        "class TensorBase:\n    def masked_fill(self): ...\ndef randn(): ...\n"
    ),
    "torch/_tensor.py": (
        "import torch._C as _C\nclass Tensor(_C.TensorBase):\n    def to(self): ...\n"
    ),
    "torch/cuda/__init__.py": "from .graphs import CUDAGraph\ndef synchronize(): ...\n",
    "torch/cuda/graphs.py": "class CUDAGraph:\n    def replay(self): ...\n",
    "torch/version.py": "__version__ = '9.9.0'\n",
}
USES = """
import torch
import torch.nn.functional as F
from torch.cuda import CUDAGraph

def step(x):
    torch.cuda.synchronize()
    CUDAGraph.replay
    torch.randn
    torch.made_at_run_time
    torch.float32
    torch.ops.aten.mm(x)
    x.masked_fill(1)
    return F.silu(torch.cuda.not_in_this_release())
"""


@pytest.fixture
def release(tmp_path):
    for path, text in RELEASE.items():
        (tmp_path / "site" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / path).write_text(text)
    return tmp_path / "site"


def test_the_names_a_source_uses_through_its_imports_and_attribute_chains():
    assert used_names(USES) >= {
        "torch",
        "torch.nn.functional",
        "torch.nn.functional.silu",
        "torch.cuda.CUDAGraph",
        "torch.cuda.CUDAGraph.replay",
        "torch.cuda.synchronize",
        "torch.cuda.not_in_this_release",
        "torch.ops.aten.mm",
    }
    assert not any(n.startswith("torch.x") or "masked_fill" in n for n in used_names(USES))


def test_each_name_is_found_unfollowed_or_missing_in_the_release(release):
    r = Release(Files(release))
    assert r.resolve("torch.cuda.synchronize")[0] == "found"
    assert r.resolve("torch.cuda.CUDAGraph.replay") == ("found", "CUDAGraph.replay")
    assert r.resolve("torch.randn")[0] == "found"  # through `from torch._C import *` (a stub)
    assert r.resolve("torch.made_at_run_time")[0] == "found"  # __all__
    assert r.resolve("torch.float32")[0] == "found"  # inside an `if`
    assert r.resolve("torch.Tensor.masked_fill") == ("found", "TensorBase.masked_fill")  # a base
    assert r.resolve("torch.ops.aten.mm")[0] == "unfollowed"  # a value made at run time
    assert r.resolve("torch.cuda.not_in_this_release") == (
        "missing",
        "no 'not_in_this_release' in torch.cuda",
    )
    assert r.resolve("torch.Tensor.index_copy_")[0] == "missing"
    assert r.resolve("torch.nn.functional.silu") == ("missing", "no 'nn' in torch")


def test_a_wheel_is_read_as_its_folder_is_and_missing_names_say_where_they_are_used(
    release, tmp_path
):
    wheel = tmp_path / "torch-9.9.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path in RELEASE:
            z.write(release / path, path)
    code = ROOT / "bench" / "_uses_for_test.py"
    code.write_text(USES)
    try:
        found = check(wheel, files=[code], reference=release)
    finally:
        code.unlink()
    assert found["release"] == "9.9.0"
    assert set(found["missing"]) == {
        "torch.cuda.not_in_this_release",
        "torch.nn.functional",
        "torch.nn.functional.silu",
    }
    assert found["missing"]["torch.cuda.not_in_this_release"]["used_in"] == [
        "bench/_uses_for_test.py"
    ]
    assert "torch.Tensor.masked_fill" not in found["missing"]  # a method the release's Tensor has
    assert set(found["unfollowed"]) == {"torch.ops.aten.mm"}


def test_every_name_the_gpu_path_uses_is_in_the_torch_it_runs_on_here():
    """The reader against this interpreter's torch, which every one of these names runs on: a
    `missing` here is the reader's fault (or dead code), so the lease's check can be trusted."""
    found = check(Path(__import__("torch").__file__).parents[1])
    assert found["names"] > 100 and not found["missing"], found["missing"]
    assert {n.split(".")[1] for n in found["unfollowed"]} <= {"ops"}, found["unfollowed"]
    assert any("attention" in str(f) for f in gpu_path_files())
