#!/usr/bin/env bash
# What a GPU lease runs, from the repository root, with `.whl` carried (bench/gpu_wheels.sh):
# the carried wheels into /tmp/site, then `make gpu-check` with the image's python3.
# GPU_CHECK_ARGS reach bench/gpu_check.py (a rerun of some parts: GPU_CHECK_ARGS="--parts ...");
# make gpu-rehearsal runs this script here with WHL_DIR, SITE and GPU_CHECK_ARGS=--dry-run.
set -euo pipefail
cd "$(dirname "$0")/.."
WHL_DIR=${WHL_DIR:-.whl}
SITE=${SITE:-/tmp/site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$WHL_DIR"/*.whl
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
if command -v make >/dev/null; then
  make gpu-check PYTHON=python3 OUT="${OUT:-gpu-check-out}" ${GPU_CHECK_ARGS:+"GPU_CHECK_ARGS=$GPU_CHECK_ARGS"}
else  # what the target runs
  # shellcheck disable=SC2086  # the arguments are words
  python3 bench/gpu_check.py --out "${OUT:-gpu-check-out}" ${GPU_CHECK_ARGS:-}
fi
