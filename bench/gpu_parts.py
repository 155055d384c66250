"""The parts of `make gpu-check` (bench/gpu_check.py) that check correctness, and what every part
shares: the seeded checkpoints, the engine built for a backend, greedy generation.

A part is `fn(device) -> dict` of its findings: `device` is "cuda" on a lease and "cpu" in the
dry run (small shapes, the Triton kernels under the interpreter). A part that fails raises;
`PartFailed` carries its findings along, so the report shows what was found before it failed.
"""

from __future__ import annotations

import functools
import gc
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.lease_host_parts import skip_reasons

ROOT = Path(__file__).resolve().parents[1]
# Seeded checkpoints, the test PKI and the worker's log: scratch space, not the report folder (a
# lease sends back what is under OUT, and a 1B checkpoint is 5 GB). Made by the first part that
# writes there; the check removes it at its end.
SCRATCH = Path(tempfile.gettempdir()) / f"intentserve-gpu-check-{os.getpid()}"
PROMPT_LEN, PARITY_TOKENS = 24, 8
MAX_MODEL_LEN = 1024
GPU_TESTS_TIMEOUT_S = 240

# Seeded checkpoints of the real models' shapes (weights random, from the seed); the dry run keeps
# each one's heads and shrinks the rest.
SHAPES = {
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        vocab_size=49152,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        vocab_size=128256,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
}
DRY = dict(intermediate_size=96, num_layers=2, head_dim=16, vocab_size=512)


class PartFailed(AssertionError):
    """A part's check failed; `found` is what it measured, kept in the report beside the error."""

    def __init__(self, message: str, found: dict) -> None:
        super().__init__(message)
        self.found = found


def host_facts(device: str) -> dict:
    facts = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
    }
    facts |= cpu_facts()
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts |= {"gpu": props.name, "gpu_memory_bytes": props.total_memory}
        facts["driver"] = driver_version()
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError as exc:
        facts["triton"] = f"missing ({exc})"
    return facts


def driver_version(run=subprocess.run, proc: Path = Path("/proc/driver/nvidia/version")) -> str:
    """The NVIDIA driver's version: nvidia-smi's answer, else the kernel module's own line."""
    try:
        done = run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        line = proc.read_text().splitlines()[
            0
        ]  # "NVRM version: NVIDIA UNIX ... Kernel Module  580.159.04  ..."
    except (OSError, IndexError):
        return "unknown (no nvidia-smi, no /proc/driver/nvidia/version)"
    words = line.split()
    return next((w for w in words if w[:1].isdigit() and w.count(".") >= 1), line)


def cpu_facts(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """The host's CPU: model, cores, and whether it has AMX (the lease host's parts use it)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return {"cpu": platform.processor() or "unknown", "cores": os.cpu_count()}
    model = next(
        (x.split(":", 1)[1].strip() for x in text.splitlines() if x.startswith("model name")), ""
    )
    flags = next(
        (x.split(":", 1)[1].split() for x in text.splitlines() if x.startswith("flags")), []
    )
    return {"cpu": model or "unknown", "cores": os.cpu_count(), "amx": "amx_tile" in flags}


def free_memory(device: str) -> None:
    """What the last engine held back to the device: its pool and graphs, cached by torch."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _config(name: str, device: str):
    from tests.worker.model.tiny_checkpoints import tiny_config

    shape = dict(SHAPES[name])
    if device == "cpu":
        shape |= DRY | {"hidden_size": shape["num_heads"] * DRY["head_dim"]}
    return tiny_config("llama", max_position_embeddings=4096, **shape)


@functools.cache
def checkpoint(name: str, device: str) -> tuple[object, dict, Path]:
    """(config, weights, folder): seeded weights written as a safetensors folder, once a run."""
    from tests.worker.model.tiny_checkpoints import random_hf_weights, write_hf_folder

    config = _config(name, device)
    weights = random_hf_weights(config, seed=0)
    scale = config.hidden_size**-0.5  # keep the residual stream tame over many layers
    weights = {k: v if "norm" in k else v * scale / 0.2 for k, v in weights.items()}
    folder = write_hf_folder(SCRATCH / name, config, weights)
    return config, weights, folder


def available_paged_backends(device: str) -> list[str]:
    from intentserve.worker.capability import probe_backends

    if device == "cpu":  # the dry run: the Triton kernel under the interpreter, and torch's
        return ["triton", "torch"]
    names = {"flash_paged": "flash", "triton_paged": "triton", "torch_paged": "torch"}
    return [
        names[b.kind.value]
        for b in probe_backends(torch.device(device))
        if b.available and b.kind.value in names
    ]


def build(
    folder: Path,
    device: str,
    dtype: str,
    backend: str,
    *,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 8192,
    cuda_graphs: bool = True,
):
    """The engine with `mode: on` and `backend`, a KV budget of max_num_seqs full-length
    sequences (the device's default share would hold the memory the next engine needs)."""
    from intentserve.policy import BackendKind, BackendStatus, resolve
    from intentserve.worker.attention.triton_paged import TRITON_KV_DTYPES
    from intentserve.worker.cache.kv_pool import KvGeometry
    from intentserve.worker.capability import probe_backends, probe_capability
    from intentserve.worker.engine.builder import EngineBuilder, build_engine
    from intentserve.worker.model.facts import model_facts
    from intentserve.worker.model.registry import load_model

    loaded = load_model(str(folder), dtype=dtype, device=device)
    c = loaded.config
    geometry = KvGeometry(c.num_layers, c.num_kv_heads, c.head_dim, loaded.dtype)
    config = (
        EngineBuilder()
        .device(device)
        .paged_attention("on", backend=backend)
        .kv_cache_memory(bytes=max_num_seqs * MAX_MODEL_LEN * geometry.bytes_per_token)
        .cuda_graphs(cuda_graphs)
        .scheduler(
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        .config
    )
    backends = probe_backends(torch.device(device))
    if device == "cpu" and backend == "triton":  # the dry run: listed as a CUDA worker lists it
        backends = tuple(
            BackendStatus(b.kind, True, "", TRITON_KV_DTYPES)
            if b.kind is BackendKind.TRITON_PAGED
            else b
            for b in backends
        )
    facts = model_facts(c, MAX_MODEL_LEN)
    capability = probe_capability(device, facts, backends=backends)
    resolution = resolve(config.paged, capability, config.auto_enabled_devices, config.weights)
    return build_engine(config, loaded=loaded, capability=capability, resolution=resolution)


def prompts(n: int, vocab: int, length: int = PROMPT_LEN) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(3, vocab, (length,), generator=gen).tolist() for _ in range(n)]


def greedy(engine, prompt_ids, max_tokens: int) -> list[list[int]]:
    from intentserve.worker.engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [list(o.new_token_ids) for o in engine.generate(prompt_ids, params)]


GPU_TEST_FILES = (
    "tests/worker/engine/test_triton_paged.py",
    "tests/worker/engine/test_cuda_backends.py",
    "tests/worker/engine/test_triton_engine.py",
    "tests/worker/engine/test_paged_attention_kernels.py",
)


def gpu_tests(device: str) -> dict:
    """The `gpu` layer: each CUDA backend against float64 attention over paged blocks (on a CUDA
    host its tests run on the device; dry, under the interpreter). `skips`: each skip's reason
    and how many tests gave it (the rehearsal reads them, and runs only the files not here)."""
    files = list(GPU_TEST_FILES)
    try:
        done = subprocess.run(
            # -v: each test is named as it starts, so a cut-off run shows the one that hung
            [sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", *files],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=GPU_TESTS_TIMEOUT_S,  # a kernel that hangs costs this part, not the lease
        )
    except subprocess.TimeoutExpired as exc:
        so_far = exc.stdout or ""  # bytes, whatever `text` says
        so_far = so_far.decode(errors="replace") if isinstance(so_far, bytes) else so_far
        raise RuntimeError(
            f"pytest ran past {exc.timeout:g} s; it had printed:\n{so_far[-3000:]}"
        ) from None
    summary = (done.stdout.strip().splitlines() or [""])[-1].strip("= ")
    if done.returncode != 0:
        raise RuntimeError(f"pytest exit {done.returncode}: {summary}\n{done.stdout[-3000:]}")
    return {"summary": summary, "files": files, "skips": skip_reasons(done.stdout)}


@torch.inference_mode()
def _transformers_greedy(config, weights, prompt_ids, max_tokens: int, device: str):
    """transformers' greedy tokens (float32, on `device`), each step over the whole context."""
    from intentserve.worker.model.hf_reference import hf_model

    model = hf_model(config, weights).to(device)
    outs = []
    for prompt in prompt_ids:
        ids: list[int] = []
        for _ in range(max_tokens):
            context = torch.tensor([prompt + ids], device=device)
            ids.append(int(model(context).logits[0, -1].argmax()))
        outs.append(ids)
    del model
    free_memory(device)
    return outs


def _agreeing(got: list[list[int]], expected: list[list[int]]) -> list[int]:
    """Per prompt: how many leading tokens agree."""
    return [
        next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x))
        for x, y in zip(got, expected, strict=True)
    ]


def engine_parity(device: str) -> dict:
    """Greedy tokens of the engine on the device (mode on, each paged backend, float32) against
    the CPU engine's and transformers' on the same seeded weights; how far bf16 agrees."""
    found: dict = {}
    unequal = []
    for name in SHAPES:
        config, weights, folder = checkpoint(name, device)
        prompt_ids = prompts(3, config.vocab_size)
        expected = _transformers_greedy(config, weights, prompt_ids, PARITY_TOKENS, device)
        cpu_engine = build(folder, "cpu", "float32", "torch")
        on_cpu = greedy(cpu_engine, prompt_ids, PARITY_TOKENS)
        del cpu_engine
        free_memory("cpu")
        for backend in available_paged_backends(device):
            engine = build(folder, device, "float32", backend)
            got = greedy(engine, prompt_ids, PARITY_TOKENS)
            row = {
                "realized": engine.realized.cache.backend.value,
                "equal_transformers": got == expected,
                "equal_cpu_engine": got == on_cpu,
            }
            del engine
            free_memory(device)
            if device == "cuda":
                bf16_engine = build(folder, device, "bfloat16", backend)
                bf16 = greedy(bf16_engine, prompt_ids, PARITY_TOKENS)
                row["bf16_agreeing_tokens"] = _agreeing(bf16, expected)
                del bf16_engine
                free_memory(device)
            found[f"{name}/{backend}"] = row
            if not (row["equal_transformers"] and row["equal_cpu_engine"]):
                unequal.append(f"{name}/{backend}: {got} (transformers {expected}, CPU {on_cpu})")
    if unequal:
        raise PartFailed("; ".join(unequal), {"cases": found})
    return {"cases": found}
