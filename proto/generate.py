"""Regenerate the Python gRPC modules from the .proto files.

Usage: python proto/generate.py [OUT_DIR]   (default: proto/, next to the sources)

The generated modules are committed so that `pip install .` needs no protoc; the test
`tests/proto/test_stubs.py` regenerates them into a temporary folder and fails when they differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
SOURCES = sorted((PROTO_ROOT / "intentserve" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc  # a test/dev dependency only

    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p.relative_to(PROTO_ROOT)) for p in SOURCES),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed for {', '.join(p.name for p in SOURCES)}")
    return sorted((out_dir / "intentserve" / "v1").glob("*_pb2*.py*"))


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT
    for path in generate(target):
        print(f"generated {path}")
