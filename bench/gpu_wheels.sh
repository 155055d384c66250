#!/usr/bin/env bash
# The wheels a GPU lease carries (its image has torch, Triton, transformers, grpcio, pytest, ...,
# but not these; nothing can be fetched there): the project's own wheel and the packages its
# image lacks, for CPython 3.12 on x86-64 Linux, into .whl/ (git-ignored). Run here, before the
# lease; bench/gpu_lease.sh installs them there. docs/benchmarks.md has the whole recipe.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WHL_PYTHON=${WHL_PYTHON:-3.12}  # the lease's Python (a rehearsal here may ask for 3.11)
rm -rf .whl && mkdir -p .whl
"$PY" -m pip wheel -q --no-deps -w .whl .
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$WHL_PYTHON" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl \
  "protobuf>=7.35.1,<8" "grpcio>=1.85" "grpcio-health-checking>=1.85" "grpcio-reflection>=1.85" "grpcio-status>=1.85" \
  pydantic pydantic-core pydantic-settings typing-inspection annotated-types python-dotenv \
  cryptography cffi pycparser gguf fastapi starlette uvicorn httptools typing-extensions \
  opentelemetry-api importlib-metadata googleapis-common-protos
# Only the newest of each: two versions of one package stop the install there.
ls .whl
du -sh .whl
