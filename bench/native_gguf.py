"""GGUF files served native against llama.cpp on the same files, one after the other (issue 41).

    python bench/native_gguf.py                  # full run: 4 files x 1/32/64 streams, writes JSON
    python bench/native_gguf.py --quick          # SmolLM2's file, 1 and 4 streams, a few tokens
    python bench/native_gguf.py --files smollm2-Q4_1 --streams 1 32 64 --tokens 32   # a subset

Files: SmolLM2's packaged Q4_1 file, Gemma 3 270M's Q4_K_M, and SmolLM2 rewritten as Q8_0 and
Q4_0 at run time (gguf's own quantizer, from the packaged file dequantized; nothing downloaded).
Per file and number of parallel sequences N: the engine with `weights: native` and with today's
dequantized bfloat16 weights (tok/s over N greedy sequences of T tokens, prompts included; time
to READY: load + build), then llama.cpp (bench/gguf_peer.py under llama-cpp-python's own venv,
`--llama-python`, default /tmp/llamavenv/bin/python; N sequences in one batched context). The
ratios printed are the issue's targets: one stream native >= 1.2x llama.cpp; 32 and 64 streams
>= 1.5x llama.cpp and not below dequantized; READY native not above dequantized.

NOTE: named native_gguf.py, not gguf.py: run as a script, bench/ comes first on sys.path and a
gguf.py there would shadow the gguf package. The machine's load (`uptime`) is printed with
every run: on a shared host the figures move with it. Without the llama venv the llama.cpp rows
say why they are missing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from gguf import GGMLQuantizationType as QType  # noqa: E402
from gguf import GGUFValueType  # noqa: E402
from intentserve.worker.engine.builder import EngineBuilder  # noqa: E402
from intentserve.worker.engine.sampling import SamplingParams  # noqa: E402
from intentserve.worker.model.registry import load_model, resolve_model_path  # noqa: E402

from bench.machine import machine_info  # noqa: E402

PROMPTS = [f"Write a short story, number {i}, about a lighthouse keeper who" for i in range(64)]
DEFAULT_LLAMA_PYTHON = "/tmp/llamavenv/bin/python"
MAX_MODEL_LEN = 256


def derive(source: Path, qtype: QType, target: Path) -> Path:
    """`source` rewritten with every matrix stored as `qtype` (vectors stay F32)."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(target, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        sub_type = field.types[-1] if field.types[0] is GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    for t in reader.tensors:
        values = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        values = values.reshape(tuple(int(n) for n in reversed(t.shape)))
        if values.ndim == 1:
            writer.add_tensor(t.name, values)
        else:
            writer.add_tensor(t.name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


FILES = ["smollm2-Q4_1", "gemma3-Q4_K_M", "smollm2-Q8_0", "smollm2-Q4_0"]


def file_path(name: str, folder: Path) -> Path:
    """The file `name` stands for; the derived ones are written into `folder`."""
    if name == "gemma3-Q4_K_M":
        return resolve_model_path("gemma3-270m")
    smollm2 = resolve_model_path("smollm2-135m")
    if name == "smollm2-Q4_1":
        return smollm2
    qtype = QType.Q8_0 if name == "smollm2-Q8_0" else QType.Q4_0
    return derive(smollm2, qtype, folder / f"{name}.gguf")


def engine_run(path: Path, fmt: str, streams: int, tokens: int) -> dict:
    start = time.perf_counter()
    loaded = load_model(str(path), dtype="auto")
    c = loaded.config
    kv_bytes = streams * MAX_MODEL_LEN * 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4
    engine = (
        EngineBuilder()
        .weights(fmt)
        .paged_attention("on", prefix_caching="off")
        .kv_cache_memory(bytes=kv_bytes)
        .scheduler(max_model_len=MAX_MODEL_LEN, max_num_seqs=streams)
        .build(loaded=loaded)
    )
    ready_s = time.perf_counter() - start
    engine.generate([PROMPTS[0]], SamplingParams(max_tokens=4))  # warm-up
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outputs = engine.generate(PROMPTS[:streams], params)
    elapsed = time.perf_counter() - start
    assert all(len(o.new_token_ids) == tokens for o in outputs)
    return {
        "tok_s": streams * tokens / elapsed,
        "ready_s": ready_s,
        "weight_bytes": engine.realized.cache.weight_bytes,
        "matmuls": engine.realized.matmuls,
    }


def llama_run(python: str, path: Path, streams: int, tokens: int, threads: int) -> dict:
    if not Path(python).exists():
        return {"skipped": f"no llama-cpp-python interpreter at {python} (--llama-python)"}
    command = [python, str(ROOT / "bench" / "gguf_peer.py"), str(path)]
    command += ["--streams", str(streams), "--tokens", str(tokens), "--threads", str(threads)]
    command += ["--prompts", json.dumps(PROMPTS[:streams])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return {"skipped": f"llama.cpp failed: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratios(row: dict) -> dict:
    native, dequantized, llama = row["native"], row["dequantized"], row["llama_cpp"]
    out = {"native_over_dequantized": native["tok_s"] / dequantized["tok_s"]}
    out["ready_native_over_dequantized"] = native["ready_s"] / dequantized["ready_s"]
    if "tok_s" in llama:
        out["native_over_llama_cpp"] = native["tok_s"] / llama["tok_s"]
    return out


def summary(row: dict) -> str:
    native, dequantized, llama = row["native"], row["dequantized"], row["llama_cpp"]
    peer = f"{llama['tok_s']:.1f}" if "tok_s" in llama else llama["skipped"]
    return (
        f"native {native['tok_s']:.1f} tok/s (READY {native['ready_s']:.1f} s), dequantized "
        f"{dequantized['tok_s']:.1f} (READY {dequantized['ready_s']:.1f} s), llama.cpp {peer}"
    )


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--llama-python", default=DEFAULT_LLAMA_PYTHON)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    parser.add_argument("--files", nargs="+", choices=FILES, default=FILES)
    parser.add_argument("--streams", nargs="+", type=int, default=[1, 32, 64])
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)
    if args.quick:
        args.files, args.streams, args.tokens = ["smollm2-Q4_1"], [1, 4], 8
    folder = Path(tempfile.mkdtemp(prefix="bench-gguf-"))
    files = {name: file_path(name, folder) for name in args.files}
    streams, tokens = args.streams, args.tokens
    report = {"machine": machine_info(), "threads": args.threads, "tokens": tokens, "rows": []}
    print(f"load before: {uptime()}", flush=True)
    for name, path in files.items():
        for n in streams:
            row = {"file": name, "streams": n}
            row["native"] = engine_run(path, "native", n, tokens)
            row["dequantized"] = engine_run(path, "dequantized", n, tokens)
            row["llama_cpp"] = llama_run(args.llama_python, path, n, tokens, args.threads)
            row["ratios"] = ratios(row)
            row["uptime"] = uptime()
            report["rows"].append(row)
            print(json.dumps({k: row[k] for k in ("file", "streams", "ratios", "uptime")}))
            print(f"  {summary(row)}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
