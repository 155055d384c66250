#!/usr/bin/env bash
# What a GPU lease runs, from the repository root, with `.whl` carried (bench/gpu_wheels.sh):
# the carried wheels into /tmp/site, then `make gpu-check` with the image's python3.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
if command -v make >/dev/null; then
  make gpu-check PYTHON=python3 OUT="${OUT:-gpu-check-out}"
else  # what the target runs
  python3 bench/gpu_check.py --out "${OUT:-gpu-check-out}"
fi
