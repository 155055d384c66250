#!/usr/bin/env bash
# The wheels a GPU lease carries (its image has torch, Triton, transformers, grpcio, pytest, ...,
# but not these; nothing can be fetched there): the project's own wheel and the packages its
# image lacks, for CPython 3.12 on x86-64 Linux, into .whl/ (git-ignored). Run here, before the
# lease; bench/gpu_lease.sh installs them there. docs/benchmarks.md has the whole recipe.
# Every runtime requirement of the package is on the image (bench/lease_image.txt) or here;
# tests/test_bench_gpu_scripts.py checks it, and make gpu-rehearsal installs exactly these.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WHL_PYTHON=${WHL_PYTHON:-3.12}  # the lease's Python (the rehearsal here asks for this one's)
WHL_DIR=${WHL_DIR:-.whl}        # what the lease carries; the rehearsal writes elsewhere
rm -rf "$WHL_DIR" && mkdir -p "$WHL_DIR"
"$PY" -m pip wheel -q --no-deps -w "$WHL_DIR" .
# At the images' locked versions (deploy/image/constraints.txt): one set that works together
# (pydantic and pydantic-core, fastapi and starlette), not the newest of each on its own; one
# version of each, since two stop the install there.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$WHL_PYTHON" --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --constraint deploy/image/constraints.txt -d "$WHL_DIR" \
  "protobuf>=7.35.1,<8" "grpcio>=1.85" "grpcio-health-checking>=1.85" "grpcio-reflection>=1.85" "grpcio-status>=1.85" \
  pydantic pydantic-core pydantic-settings typing-inspection annotated-types python-dotenv \
  cryptography cffi pycparser gguf fastapi starlette uvicorn httptools typing-extensions \
  opentelemetry-api importlib-metadata googleapis-common-protos "llguidance>=1.9,<2"
ls "$WHL_DIR"
du -sh "$WHL_DIR"
