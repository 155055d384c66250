"""The parts of `make gpu-check` (bench/gpu_check.py), each returning a dict of its findings."""

from __future__ import annotations

import functools
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# Seeded checkpoints and the test PKI: scratch space, not the report folder (a lease sends back
# what is under OUT, and a 1B checkpoint is 5 GB).
SCRATCH = Path(tempfile.mkdtemp(prefix="intentserve-gpu-check-"))
PROMPT_LEN, PARITY_TOKENS = 24, 8

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
STREAMS = {"cuda": (1, 32, 256), "cpu": (1, 4)}


def host_facts(device: str) -> dict:
    facts = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts |= {"gpu": props.name, "gpu_memory_bytes": props.total_memory}
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError as exc:
        facts["triton"] = f"missing ({exc})"
    return facts


def gpu_tests(device: str) -> dict:
    """The `gpu` layer: on a CUDA host its tests run on the device; dry, the interpreter's."""
    files = [
        "tests/worker/engine/test_triton_paged.py",
        "tests/worker/engine/test_cuda_backends.py",
        "tests/worker/engine/test_triton_engine.py",
        "tests/worker/engine/test_paged_attention_kernels.py",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    summary = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode != 0:
        raise RuntimeError(f"pytest exit {done.returncode}: {summary}\n{done.stdout[-3000:]}")
    return {"summary": summary}


def _config(name: str, device: str):
    from tests.worker.model.tiny_checkpoints import tiny_config

    shape = dict(SHAPES[name])
    if device == "cpu":
        shape |= DRY | {"hidden_size": shape["num_heads"] * DRY["head_dim"]}
    return tiny_config("llama", max_position_embeddings=4096, **shape)


@functools.cache
def _checkpoint(name: str, device: str) -> tuple[object, dict, Path]:
    """(config, weights, folder): seeded weights written as a safetensors folder, once a run."""
    from tests.worker.model.tiny_checkpoints import random_hf_weights, write_hf_folder

    config = _config(name, device)
    weights = random_hf_weights(config, seed=0)
    scale = config.hidden_size**-0.5  # keep the residual stream tame over many layers
    weights = {k: v if "norm" in k else v * scale / 0.2 for k, v in weights.items()}
    folder = write_hf_folder(SCRATCH / name, config, weights)
    return config, weights, folder


def _available_paged_backends(device: str) -> list[str]:
    from intentserve.worker.capability import probe_backends

    if device == "cpu":  # the dry run: the Triton kernel under the interpreter, and torch's
        return ["triton", "torch"]
    names = {"flash_paged": "flash", "triton_paged": "triton", "torch_paged": "torch"}
    return [
        names[b.kind.value]
        for b in probe_backends(torch.device(device))
        if b.available and b.kind.value in names
    ]


def _engine(
    folder: Path,
    device: str,
    dtype: str,
    backend: str,
    max_num_seqs: int = 8,
    cuda_graphs: bool = True,
):
    from intentserve.policy import BackendKind, BackendStatus, resolve
    from intentserve.worker.attention.triton_paged import TRITON_KV_DTYPES
    from intentserve.worker.capability import probe_backends, probe_capability
    from intentserve.worker.engine.builder import EngineBuilder, build_engine
    from intentserve.worker.model.facts import model_facts
    from intentserve.worker.model.registry import load_model

    loaded = load_model(str(folder), dtype=dtype, device=device)
    config = (
        EngineBuilder()
        .device(device)
        .paged_attention("on", backend=backend)
        .cuda_graphs(cuda_graphs)
        .scheduler(max_model_len=1024, max_num_seqs=max_num_seqs, max_num_batched_tokens=8192)
        .config
    )
    backends = probe_backends(torch.device(device))
    if device == "cpu":  # the dry run: the Triton backend as a CUDA worker lists it
        backends = tuple(
            BackendStatus(b.kind, True, "", TRITON_KV_DTYPES)
            if b.kind is BackendKind.TRITON_PAGED
            else b
            for b in backends
        )
    facts = model_facts(loaded.config, 1024)
    capability = probe_capability(device, facts, backends=backends)
    resolution = resolve(config.paged, capability, config.auto_enabled_devices, config.weights)
    return build_engine(config, loaded=loaded, capability=capability, resolution=resolution)


def _prompts(n: int, vocab: int, length: int = PROMPT_LEN) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(3, vocab, (length,), generator=gen).tolist() for _ in range(n)]


def _greedy(engine, prompts, max_tokens: int) -> list[list[int]]:
    from intentserve.worker.engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [list(o.new_token_ids) for o in engine.generate(prompts, params)]


def _reference_greedy(config, weights, prompts, max_tokens: int) -> list[list[int]]:
    from intentserve.worker.model.hf_reference import hf_logits, hf_model

    model = hf_model(config, weights)
    outs = []
    for prompt in prompts:
        ids: list[int] = []
        for _ in range(max_tokens):
            ids.append(int(hf_logits(model, prompt + ids)[-1].argmax()))
        outs.append(ids)
    return outs


def engine_parity(device: str) -> dict:
    """Greedy tokens of the engine (mode on, each paged backend) against transformers."""
    found: dict = {}
    for name in SHAPES:
        config, weights, folder = _checkpoint(name, device)
        prompts = _prompts(3, config.vocab_size)
        expected = _reference_greedy(config, weights, prompts, PARITY_TOKENS)
        for backend in _available_paged_backends(device):
            engine = _engine(folder, device, "float32", backend)
            got = _greedy(engine, prompts, PARITY_TOKENS)
            realized = engine.realized.cache.backend.value
            row = {"realized": realized, "equal_float32": got == expected}
            if device == "cuda":
                bf16 = _greedy(_engine(folder, device, "bfloat16", backend), prompts, PARITY_TOKENS)
                row["bf16_agreeing_tokens"] = [
                    next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x))
                    for x, y in zip(bf16, expected, strict=True)
                ]
            found[f"{name}/{backend}"] = row
            if not row["equal_float32"]:
                raise AssertionError(f"{name}/{backend}: {got} != transformers' {expected}")
            del engine
    return {"cases": found}


def served_over_tls(device: str) -> dict:
    """A controller and one worker over mutual TLS, no Ray: READY only once the realized paged
    cache is verified; then `backend: flash` where vllm-flash-attn is missing, refused by name."""
    from intentserve.controller.launch.pki import DeploymentCa
    from intentserve.controller.server import ControllerServer
    from intentserve.controller.settings import ControllerSettings
    from intentserve.worker.runtime.lifecycle import Phase, WorkerRuntime
    from intentserve.worker.runtime.spec import WorkerSpec

    _, _, folder = _checkpoint("smollm2-135m", device)
    pki = SCRATCH / "pki"
    ca = DeploymentCa.create("gpucheck")
    files = {}
    identity = ca.controller_identity(())
    for part in ("cert", "key", "ca"):
        path = pki / f"controller.{part}"
        pki.mkdir(parents=True, exist_ok=True)
        path.write_bytes(getattr(identity, f"{part}_pem"))
        files[f"tls_{part}_file"] = str(path)
    found: dict = {}
    for backend in ("triton" if device == "cuda" else "torch", "flash"):
        settings = ControllerSettings(
            host="127.0.0.1",
            port=0,
            deployment="gpucheck",
            paged_attention="on",
            attention_backend=backend,
            heartbeat_interval_s=0.2,
            reconcile_interval_s=0.1,
            **files,
        )
        server = ControllerServer(settings.config()).start()
        spec = WorkerSpec(
            worker_id="gpucheck-0",
            controller_address=server.registry_address,
            model=str(folder),
            device=device,
            tls=ca.issue("gpucheck-0").to_dict(),
            deployment="gpucheck",
        )
        start = time.perf_counter()
        runtime = WorkerRuntime(spec).start()
        try:
            phase = runtime.wait_for(Phase.SERVING, Phase.REJECTED, Phase.FAILED)
            record = next(iter(server.deployment.workers()), None)
            found[backend] = {
                "phase": str(getattr(phase, "value", phase)),
                "seconds": round(time.perf_counter() - start, 2),
                "worker_state": record.state.value if record else "",
                "realized_backend": record.realized.backend.value
                if record and record.realized
                else "",
                "problem": record.problem.message if record and record.problem else "",
            }
        finally:
            runtime.stop(grace_s=0)
            server.stop(grace_s=0)
    served = next(iter(found.values()))
    if served["worker_state"] != "ready":
        raise AssertionError(f"the worker did not become READY: {found}")
    flash_missing = "flash" not in _available_paged_backends(device)
    if flash_missing and "vllm" not in found["flash"]["problem"]:
        raise AssertionError(f"backend flash without vllm-flash-attn was not named: {found}")
    return {"cases": found}


def _measure_ceilings(device: str) -> dict:
    """HBM bandwidth (a large copy) and the bf16 matmul ceiling, in this run."""
    if device != "cuda":
        return {"bandwidth_bytes_s": 0.0, "matmul_flops_s": 0.0}
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")

    def timed(fn, reps: int) -> float:
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / reps

    copy_s = timed(lambda: dst.copy_(src), 20)
    mm_s = timed(lambda: a @ a, 50)
    return {"bandwidth_bytes_s": 2 * n / copy_s, "matmul_flops_s": 2 * 8192**3 / mm_s}


def _decode_rate(engine, streams: int, max_tokens: int, device: str) -> tuple[float, float]:
    """(tokens/s, seconds a step) over `max_tokens` steps of `streams` 8-token prompts, warmed."""
    vocab = engine.runner.model.config.vocab_size
    _greedy(engine, _prompts(streams, vocab, 8), 4)  # warm: Triton compiles, the allocator
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    outs = _greedy(engine, _prompts(streams, vocab, 8), max_tokens)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return sum(len(o) for o in outs) / seconds, seconds / max_tokens


def throughput(device: str) -> dict:
    """tokens/s of the 1B shape in bf16 at each stream count, against the in-run limits; at one
    stream, the graph-replayed step against the eager one."""
    _, _, folder = _checkpoint("llama-3.2-1b", device)
    ceilings = _measure_ceilings(device)
    dtype = "bfloat16"
    backend = _available_paged_backends(device)[0]
    max_tokens = 64 if device == "cuda" else 4
    rows, graphs = [], ""
    for streams in STREAMS[device]:
        engine = _engine(folder, device, dtype, backend, max_num_seqs=streams)
        graphs = engine.realized.cache.decode_graphs or graphs
        params_bytes = engine.realized.cache.weight_bytes
        rate, step_s = _decode_rate(engine, streams, max_tokens, device)
        row = {"streams": streams, "tokens_per_s": rate, "step_ms": 1000 * step_s}
        del engine
        if streams == 1:
            eager = _engine(folder, device, dtype, backend, max_num_seqs=1, cuda_graphs=False)
            row["eager_step_ms"] = 1000 * _decode_rate(eager, 1, max_tokens, device)[1]
            row["graph_speedup"] = row["eager_step_ms"] / row["step_ms"]
            del eager
        if ceilings["bandwidth_bytes_s"]:
            limit_ms = 1000 * params_bytes / ceilings["bandwidth_bytes_s"]
            row["weight_streaming_limit_ms"] = limit_ms
            row["x_limit"] = row["step_ms"] / limit_ms
            flops = 2 * (params_bytes / 2) * rate  # bf16: 2 bytes a parameter
            row["share_of_matmul_ceiling"] = flops / ceilings["matmul_flops_s"]
        rows.append(row)
    targets = {
        "one stream <= 2x weight-streaming limit": rows[0].get("x_limit", 0) <= 2,
        "256 streams >= 20% of the bf16 matmul ceiling": rows[-1].get("share_of_matmul_ceiling", 0)
        >= 0.2,
        "graph step >= 3x faster than eager at one stream": rows[0]["graph_speedup"] >= 3,
    }
    return {
        "backend": backend,
        "dtype": dtype,
        "ceilings": ceilings,
        "rows": rows,
        "decode_graphs": graphs or "none (eager steps)",
        "targets_met": targets if device == "cuda" else "not measured (dry run)",
    }


def write_report(results: dict, out: Path) -> None:
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    lines = [
        f"# gpu-check ({'dry run, CPU' if results['dry_run'] else results['host'].get('gpu')})",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in results["host"].items()]
    lines += ["", "| part | ok | seconds | finding |", "| --- | --- | --- | --- |"]
    for name, part in results.items():
        if not isinstance(part, dict) or "ok" not in part:
            continue
        finding = part.get("error") or json.dumps(
            {k: v for k, v in part.items() if k not in ("ok", "seconds")}, default=str
        )
        lines.append(f"| {name} | {part['ok']} | {part['seconds']} | {finding[:400]} |")
    tp, nan = results.get("throughput", {}), float("nan")
    if tp.get("rows"):
        lines += [
            "",
            "| streams | tok/s | step ms | x weight-streaming limit | share of bf16 matmul peak |",
        ]
        lines += ["| --- | --- | --- | --- | --- |"]
        for r in tp["rows"]:
            lines.append(
                f"| {r['streams']} | {r['tokens_per_s']:.0f} | {r['step_ms']:.2f} | "
                f"{r.get('x_limit', nan):.2f} | {r.get('share_of_matmul_ceiling', nan):.1%} |"
            )
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")
